"""The pages' Jinja2 templates (autoescaped: every value from a topic, a message or a schema is
HTML-escaped). Plain HTML and inline CSS: no script, no build step, and they render inside
Airflow's sandboxed iframes.

Light and dark follow Airflow's theme without a script: Airflow sets ``color-scheme`` on its
page to the theme the user chose (light, dark, or the system's), the iframe inherits it, and a
framed document's ``prefers-color-scheme`` is the used color scheme of its iframe element (CSS
Media Queries 5), so the ``@media (prefers-color-scheme: dark)`` rules below apply exactly when
Airflow is dark; a page opened on its own follows the browser's setting."""

from __future__ import annotations

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>{% block title %}deltaferry{% endblock %}</title>
<style>
:root { color-scheme: light dark; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 16px 20px;
       color: #1a202c; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 6px; }
.sub { color: #5a6473; margin: 0 0 12px; }
nav.tabs { margin: 6px 0 14px; border-bottom: 1px solid #d7dce3; }
nav.tabs a { display: inline-block; padding: 6px 12px; color: #2b6cb0; text-decoration: none; }
nav.tabs a.on { border-bottom: 2px solid #2b6cb0; font-weight: 600; color: #1a202c; }
table { border-collapse: collapse; margin: 4px 0 10px; }
th, td { border-bottom: 1px solid #e5e8ee; padding: 5px 10px; text-align: left; vertical-align: top; }
th { background: #f4f6f9; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
.preview { white-space: pre-wrap; overflow-wrap: anywhere; max-width: 520px; }
.state-success { color: #276749; } .state-failed { color: #c53030; } .state-running { color: #2b6cb0; }
.note { color: #9c4221; } .muted { color: #718096; }
.bad { background: #fff5f5; border: 1px solid #feb2b2; padding: 8px 12px; margin: 8px 0; }
.tree div { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
.tree .type { color: #6b46c1; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; margin: 4px 0 12px; }
dl.facts dt { color: #5a6473; } dl.facts dd { margin: 0; }
.controls { margin: 4px 0 8px; } .controls a { color: #2b6cb0; text-decoration: none; }
.controls a.on { font-weight: 600; color: #1a202c; border-bottom: 2px solid #2b6cb0; }
form.filters { margin: 6px 0; } form.filters label { margin-right: 10px; }
form.filters input[type=number] { width: 6em; }
th a { color: inherit; } th a.on { text-decoration: none; }
svg.chart { display: block; margin: 2px 0 4px; max-width: 100%; height: auto; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #5a6473; }
.legend { margin: 0 0 8px; color: #5a6473; } .legend span.item { margin-right: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
td.problem { background: rgba(229, 62, 62, 0.14); box-shadow: inset 3px 0 0 #e53e3e; }
tr.problems td.problem-text { color: #e53e3e; padding-top: 0; }
th.group { text-align: center; border-bottom: 1px solid #cbd5e0; }
td .when { font-size: 12.5px; } td a.log, td a.work-log { font-size: 12.5px; }
td.key { white-space: nowrap; max-width: 32ch; overflow: hidden; text-overflow: ellipsis; }
table.hex td { border: 0; padding: 0 12px 0 0; white-space: pre; }
table.hex td.text { color: #5a6473; }
form.search { margin: 6px 0 10px; } form.search label { margin-right: 10px; }
form.search input[type=number] { width: 6em; }
.pager a { color: #2b6cb0; text-decoration: none; }
.notice { background: #fffaf0; border: 1px solid #fbd38d; padding: 6px 12px; margin: 8px 0; }
.done { background: #f0fff4; border: 1px solid #9ae6b4; padding: 8px 12px; margin: 8px 0; }
button.replay { font-weight: 600; }
@media (prefers-color-scheme: dark) {
  body { color: #e4e4e7; background: transparent; }
  a, nav.tabs a, .controls a, .pager a { color: #90cdf4; }
  nav.tabs { border-bottom-color: #3f3f46; }
  nav.tabs a.on, .controls a.on { color: #fafafa; border-bottom-color: #90cdf4; }
  th, td { border-bottom-color: #27272a; }
  th { background: #18181b; }
  .sub, .muted, dl.facts dt, .legend, table.hex td.text { color: #a1a1aa; }
  .note { color: #fbd38d; }
  .state-success { color: #68d391; } .state-failed { color: #fc8181; }
  .state-running { color: #90cdf4; }
  .tree .type { color: #b794f4; }
  .bad { background: #3b1c1c; border-color: #9b2c2c; }
  .notice { background: #3a2e12; border-color: #975a16; }
  .done { background: #12301d; border-color: #2f855a; }
  svg.chart text { fill: #a1a1aa; }
  svg.chart line { stroke: #3f3f46; }
  svg.chart polyline.line { stroke: #90cdf4; } svg.chart circle.point { fill: #90cdf4; }
  input, select, button { color-scheme: dark; }
}
</style></head>
<body>
{% block body %}{% endblock %}
</body></html>
"""

TOPIC_TABS = """{% if show_tabs %}<nav class="tabs">
<a href="{{ root }}/">All topics</a>
{% for key, label in pages %}<a href="{{ root }}/topics/{{ topic | urlencode }}/{{ key }}"
  {% if key == page %}class="on"{% endif %}>{{ label }}</a>{% endfor %}
</nav>{% endif %}"""

TOPICS = """{% extends "base.html" %}
{% block title %}deltaferry topics{% endblock %}
{% block body %}
{% set query = page.query %}
{% macro sort_header(key, label, css="") -%}
<th class="{{ css }}"><a id="th-sort-{{ key }}" href="{{ root }}/{{ page.query.sort_link(key) }}"
  {% if page.query.sort == key %}class="on"{% endif %}>{{ label }}</a>{% if page.query.sort == key %} {{ "↑" if page.query.order == "asc" else "↓" }}{% endif %}</th>
{%- endmacro %}
<h1>deltaferry topics</h1>
<p class="sub">Topics file <code>{{ page.topics_file }}</code>, warehouse <code>{{ page.warehouse }}</code>.
Lag: messages on the topic not yet in the table (broker watermarks against the streaming checkpoint).</p>
{% for note in page.notices %}<p class="notice pool-notice">{{ note }}</p>{% endfor %}
{% if page.bad_entries %}<div class="bad"><strong>Bad entries of the topics file</strong> (no DAG runs them):
<ul>{% for problem in page.bad_entries %}<li class="bad-entry">{{ problem }}</li>{% endfor %}</ul></div>{% endif %}
<p class="controls" id="state-filters">Last run:
<a id="state-all" href="{{ root }}/{{ query.link(state=None) }}" {% if not query.state %}class="on"{% endif %}>all ({{ page.total }})</a>
{% for state, count in page.state_counts %} · <a id="state-{{ state }}" href="{{ root }}/{{ query.link(state=state) }}"
  {% if query.state == state %}class="on"{% endif %}>{{ "no run yet" if state == "none" else state }} ({{ count }})</a>{% endfor %}</p>
<p class="controls" id="sorts">Sort by:
{% for key, label in (("name", "name"), ("state", "state (failed first)"), ("lag", "lag"), ("last_success", "last success")) %}{% if not loop.first %} · {% endif %}<a id="sort-{{ key }}" href="{{ root }}/{{ query.sort_link(key) }}"
  {% if query.sort == key %}class="on"{% endif %}>{{ label }}</a>{% if query.sort == key %} {{ "↑" if query.order == "asc" else "↓" }}{% endif %}{% endfor %}</p>
<form class="filters" id="filters" method="get" action="{{ root }}/">
<input type="hidden" name="sort" value="{{ query.sort }}"><input type="hidden" name="order" value="{{ query.order }}">
<label>name contains <input type="search" name="q" id="filter-q" value="{{ query.q }}"></label>
<label>last run <select name="state" id="filter-state"><option value="">any</option>
{% for state, count in page.state_counts %}<option value="{{ state }}" {% if query.state == state %}selected{% endif %}>{{ "no run yet" if state == "none" else state }}</option>{% endfor %}
{% if query.state and query.state not in page.states %}<option value="{{ query.state }}" selected>{{ query.state }}</option>{% endif %}</select></label>
<label>lag at least <input type="number" min="0" name="min_lag" id="filter-min-lag" value="{{ query.min_lag if query.min_lag is not none else '' }}"></label>
<label>no success for <input type="number" min="0" step="any" name="stale_hours" id="filter-stale-hours" value="{{ '%g' % query.stale_hours if query.stale_hours is not none else '' }}"> hours</label>
<button type="submit" id="filter-apply">Filter</button>
{% if query.filtered %}<a id="filter-clear" href="{{ root }}/{{ query.link(state=None, q='', min_lag=None, stale_hours=None) }}">clear filters</a>{% endif %}
</form>
<p class="muted" id="shown">{% if page.pages > 1 %}{{ page.first + 1 }}-{{ page.first + page.rows | length }} of {{ page.matching }} matching, {% endif %}{{ page.rows | length }} of {{ page.total }} topic(s) shown.
{% if page.pages > 1 %}<span id="pager">{% if page.number > 1 %}<a id="page-prev" href="{{ root }}/{{ query.link(page=page.number - 1) }}">previous</a> · {% endif %}
page {{ page.number }} of {{ page.pages }}{% if page.number < page.pages %} · <a id="page-next" href="{{ root }}/{{ query.link(page=page.number + 1) }}">next</a>{% endif %}</span>{% endif %}</p>
<table id="topics">
<tr><th colspan="3"></th><th colspan="5" class="group">last run that did work</th><th colspan="7"></th></tr>
<tr>{{ sort_header("name", "topic") }}<th>format</th>{{ sort_header("state", "last run") }}
<th class="num">read</th><th>written</th><th class="num">quarantined</th><th class="num">seconds</th><th>run</th>
{{ sort_header("last_success", "last success") }}<th class="num">rows</th>
{{ sort_header("lag", "lag", "num") }}<th class="num">quarantined<br>total</th>
<th>schema</th><th>pages</th></tr>
{% for row in page.rows %}{% set problems = row.problems %}{% set run = row.last_run %}{% set work = run.work if run else none %}
<tr data-topic="{{ row.name }}"{% if problems %} class="has-problem"{% endif %}>
<td class="topic"><a class="dag" href="{{ dag_url(airflow, row.dag_id) }}"><strong>{{ row.name }}</strong></a>
<div class="muted">{{ row.dag_id }}{% if row.schedule %} · {{ row.schedule }}{% endif %}</div>
{% if row.pattern_entry %}<div class="muted entry{% if 'gone' in row.pattern_entry %} problem{% endif %}">{{ row.pattern_entry }}</div>{% endif %}
{% if row.paused %}<div class="paused"><strong class="state-failed">paused</strong>
{% if can_resume(row.dag_id) %}<form method="post" action="{{ root }}/topics/{{ row.name | urlencode }}/resume" class="resume">
<input type="hidden" name="form_token" value="{{ resume_token(row.dag_id) }}">
<button type="submit" class="resume" id="resume-{{ row.name }}">Resume</button></form>
{% else %}<div class="muted resume-cli">Resuming needs permission to trigger {{ row.dag_id }}; or run <code>deltaferry resume {{ row.name }}</code>.</div>{% endif %}</div>{% endif %}</td>
<td>{{ row.format }}</td>
<td class="state{% if 'run' in problems %} problem{% endif %}">{% if run %}<a class="run state-{{ run.state }}" href="{{ run_url(airflow, row.dag_id, run.run_id) }}">{{ run.state }}</a>
  <div class="muted when">{{ run.at_label }} {{ run.at }}</div>
  <a class="log" href="{{ task_url(airflow, row.dag_id, run.run_id, ingest_task) }}">ingest log</a>{% else %}<span class="muted">no run yet</span>{% endif %}</td>
{% if work %}<td class="num work-read">{{ work.figure("messages_read") | count_text }}</td>
<td class="work-written">{{ work.written }}</td>
<td class="num work-quarantined{% if 'quarantine' in problems %} problem{% endif %}">{{ work.quarantined | count_text }}
{%- for name, failed, verb in work.expectations %}<div class="muted expectation{% if failed %} failed{% endif %}" title="expectation {{ name }}: records that failed it this run">{{ name }} {{ failed | count_text }} {{ verb }}</div>{% endfor %}</td>
<td class="num work-seconds">{% if work.figure("seconds") is not none %}{{ "%.1f" | format(work.figure("seconds")) }}{% else %}–{% endif %}</td>
<td class="work-run">{% if work is sameas run %}<span class="muted">the last run</span>{% else %}<a class="work-link state-{{ work.state }}" href="{{ run_url(airflow, row.dag_id, work.run_id) }}">{{ work.state }}</a>
  <div class="muted when">{{ work.at_label }} {{ work.at }}</div>{% endif %}
  <a class="work-log" href="{{ task_url(airflow, row.dag_id, work.run_id, ingest_task) }}">ingest log</a></td>
{% else %}<td colspan="5" class="muted work-none">{% if run %}no recent run read messages{% else %}–{% endif %}</td>{% endif %}
<td class="last-success">{% if row.last_success %}{{ row.last_success | when }}{% else %}<span class="muted">never</span>{% endif %}</td>
<td class="num rows">{{ row.rows | count_text }}</td>
<td class="num lag{% if 'lag' in problems %} problem{% endif %}"{% if row.max_lag is not none %} title="alert over {{ row.max_lag | count_text }} (alerts.max_lag_messages)"{% endif %}>{{ row.lag | count_text }}</td>
<td class="num quarantined-total">{{ row.quarantined_total | count_text }}</td>
<td class="schema">{{ row.schema_version or "–" }}</td>
<td><a href="{{ root }}/topics/{{ row.name | urlencode }}/schema">schema history</a><br>
<a href="{{ root }}/topics/{{ row.name | urlencode }}/quarantine">quarantine</a><br>
<a href="{{ root }}/topics/{{ row.name | urlencode }}/health">table health</a><br>
<a href="{{ root }}/topics/{{ row.name | urlencode }}/runs">run history</a></td>
</tr>
{% if problems %}<tr class="problems"><td></td><td colspan="14" class="problem-text">{{ problems.values() | join("; ") }}</td></tr>{% endif %}
{% if row.notes %}<tr class="notes"><td></td><td colspan="14" class="note">{{ row.notes | join("; ") }}</td></tr>{% endif %}
{% else %}<tr><td colspan="15" class="muted">{% if page.total and query.filtered %}No topic matches the filters.{% else %}The topics file lists no valid topic.{% endif %}</td></tr>
{% endfor %}
</table>
{% endblock %}
"""

SCHEMA = """{% extends "base.html" %}
{% block title %}{{ topic }}: schema history{% endblock %}
{% block body %}
<h1>{{ topic }}: schema history</h1>
{% include "tabs.html" %}
<p class="sub">Format {{ h.format }}; {% if h.cached %}schema cache <code>{{ h.location }}</code>{% else %}schema in the Schema Registry{% endif %}.</p>
<p id="schema-mode">Schema mode (<code>schema:</code>) <strong>{{ h.mode }}</strong>{% if h.modes and h.modes[0].mode != h.mode %} in the topics file; its runs last used <strong>{{ h.modes[0].mode }}</strong> (the next run that reads messages uses {{ h.mode }}){% endif %}.</p>
{% if h.modes %}<table id="modes">
<tr><th>mode</th><th>since</th><th class="num">schema version then</th></tr>
{% for m in h.modes %}<tr><td class="mode">{{ m.mode }}</td><td>{{ m.since | when }}</td><td class="num">{% if m.schema_version is not none %}v{{ m.schema_version }}{% else %}–{% endif %}</td></tr>{% endfor %}
</table>{% endif %}
{% if h.rescued %}<h2>Rescued in the table's <code>_rescued</code> column</h2>
<table id="rescued"><tr><th>path</th><th class="num">rows</th></tr>
{% for path, rows in h.rescued %}<tr><td class="mono path">{{ path }}</td><td class="num">{{ rows | count_text }}</td></tr>{% endfor %}
</table>{% endif %}{% if h.rescued_problem %}<p class="note">{{ h.rescued_problem }}</p>{% endif %}
{% if h.discarded %}<h2>Left out of the rows (<code>discard_new_fields</code>)</h2>
<p class="sub">Fields not in the schema, counted since {{ h.discarded_since | when }}.</p>
<table id="discarded"><tr><th>field</th><th class="num">messages</th></tr>
{% for path, messages in h.discarded %}<tr><td class="mono path">{{ path }}</td><td class="num">{{ messages | count_text }}</td></tr>{% endfor %}
</table>{% endif %}
<h2>{% if h.cached %}Versions of the schema cache{% else %}Where the schema lives{% endif %}</h2>
{% if h.versions %}<table id="versions">
<tr><th class="num">version</th><th>created</th><th>offsets covered</th><th>change from the previous version</th></tr>
{% for v in h.versions %}<tr><td class="num">v{{ v.version }}</td><td>{{ v.created_at | when }}</td>
<td class="mono offsets">{% if h.offsets_note and v.offsets == "none" %}<span class="muted">{{ h.offsets_note }}</span>{% else %}{{ v.offsets }}{% endif %}</td><td class="changes">{{ v.changes }}</td></tr>{% endfor %}
</table>{% elif not h.cached %}<p id="schema-source">{{ h.format }} topics keep no copy of their schema here: ingest reads with the Schema Registry's
subject <code>{{ h.subject }}</code>, {% if h.read_version is not none %}version {{ h.read_version }}{% else %}its latest version{% endif %}
({% if h.pinned %}pinned by the topic's avro.schema_version{% else %}the latest registered{% endif %}){% if h.registry_url %}, registry <code>{{ h.registry_url }}</code>{% endif %}; its versions are listed below.</p>
{% else %}<p class="muted">No schema stored yet.</p>{% endif %}
{% if h.subject %}<h2>Schema Registry: subject <code>{{ h.subject }}</code></h2>
{% if h.registry_url %}<p class="sub">Registry <code>{{ h.registry_url }}</code></p>{% endif %}
{% if h.registry_problem %}<p class="note">{{ h.registry_problem }}</p>{% endif %}
{% if h.registry %}<table id="registry">
<tr><th class="num">version</th><th class="num">schema id</th><th>type</th><th>change from the previous version</th></tr>
{% for r in h.registry %}<tr><td class="num">{{ r.version }}</td><td class="num">{{ r.schema_id }}</td>
<td>{{ r.schema_type }}</td><td class="changes">{{ r.changes }}</td></tr>{% endfor %}
</table>{% endif %}{% endif %}
<h2>Current schema{% if h.tree_source %} <span class="muted">({{ h.tree_source }})</span>{% endif %}</h2>
{% if h.tree %}<div class="tree" id="tree">
{% for f in h.tree %}<div style="padding-left: {{ f.depth * 22 }}px">{{ f.name }} <span class="type">{{ f.type }}</span></div>
{% endfor %}</div>{% else %}<p class="muted">No schema yet.</p>{% endif %}
{% endblock %}
"""

QUARANTINE = """{% extends "base.html" %}
{% block title %}{{ topic }}: quarantine{% endblock %}
{% block body %}
{% set query = q.query %}
<h1>{{ topic }}: quarantine</h1>
{% include "tabs.html" %}
<p class="sub">Delta table <code>{{ q.shown_location }}</code> of the warehouse: {{ q.total | count_text }} message(s), {{ q.waiting | count_text }} not replayed.</p>
{% for note in query.notes %}<p class="notice">{{ note }}</p>{% endfor %}
{% if q.problem %}<p class="note">{{ q.problem }}</p>{% endif %}
{% if q.reasons %}<h2>Messages per reason</h2>
<table id="reasons"><tr><th class="num">messages</th><th class="num">not replayed</th><th>reason</th></tr>
{% for reason, counts in q.reasons.items() %}<tr><td class="num">{{ counts[0] | count_text }}</td><td class="num">{{ counts[1] | count_text }}</td>
<td class="reason"><a href="{{ here }}?reason={{ reason | urlencode }}">{{ reason }}</a></td></tr>{% endfor %}</table>
<h2>Search</h2>
<form class="search" id="search" method="get" action="{{ here }}">
<label>reason contains <input type="search" name="reason" id="filter-reason" list="known-reasons" value="{{ query.filter.reason or '' }}" size="32"></label>
<datalist id="known-reasons">{% for reason in q.reasons %}<option value="{{ reason }}">{% endfor %}</datalist>
<label>partition <input type="number" min="0" name="partition" id="filter-partition" value="{{ query.filter.partition if query.filter.partition is not none else '' }}"></label>
<label>key contains <input type="search" name="key" id="filter-key" value="{{ query.filter.key or '' }}"></label>
<label><input type="checkbox" name="contract" value="1" id="filter-contract"{% if query.filter.contract %} checked{% endif %}> schema contract reasons only</label>
<label>per page <input type="number" min="1" max="{{ max_size }}" name="size" id="filter-size" value="{{ query.size }}"></label>
<button type="submit" id="filter-apply">Search</button>
{% if query.filter.any %}<a id="filter-clear" href="{{ here }}">clear</a>{% endif %}
</form>
<p class="muted" id="shown">{% if q.matching %}{{ q.first + 1 }}–{{ q.first + q.latest | length }} of {{ q.matching | count_text }} message(s){% else %}No message{% endif -%}
{% if query.filter.any %} where {{ query.filter.text() }}{% endif %}, newest first; {{ q.matching_waiting | count_text }} of them not replayed.
{% if q.pages > 1 %}<span class="pager" id="pager">{% if query.page > 1 %}<a id="page-prev" href="{{ here }}{{ query.link(page=query.page - 1) }}">previous</a> · {% endif %}
page {{ query.page }} of {{ q.pages }}{% if query.page < q.pages %} · <a id="page-next" href="{{ here }}{{ query.link(page=query.page + 1) }}">next</a>{% endif %}</span>{% endif %}</p>
{% if can_replay and q.matching_waiting %}<form method="get" action="{{ here }}/replay" id="replay-start">
{% if query.filter.reason is not none %}<input type="hidden" name="reason" value="{{ query.filter.reason }}">{% endif %}
{% if query.filter.partition is not none %}<input type="hidden" name="partition" value="{{ query.filter.partition }}">{% endif %}
{% if query.filter.key is not none %}<input type="hidden" name="key" value="{{ query.filter.key }}">{% endif %}
{% if query.filter.contract %}<input type="hidden" name="contract" value="1">{% endif %}
<button type="submit" class="replay" id="replay-button">Replay {{ q.matching_waiting | count_text }} message(s)…</button>
<span class="muted">a run of {{ dag_id }} reads them again through the topic's decoder (after a fix) and lands those that parse; you confirm first</span>
</form>{% elif not can_replay %}<p class="muted" id="replay-cli">Replaying needs permission to trigger {{ dag_id }}; or run <code>deltaferry quarantine replay {{ topic }}</code>.</p>{% endif %}
<table id="messages"><tr><th>partition@offset</th><th>key</th><th>value (preview)</th><th>reason</th>
<th class="num">schema</th><th>quarantined</th></tr>
{% for m in q.latest %}<tr><td class="mono">p{{ m.partition }}@{{ m.offset }}</td>
<td class="mono key" title="{{ m.key }}">{% if m.key_hex %}{% for hex, text in m.key_hex %}{{ hex }} |{{ text }}|{% endfor %}{% else %}{{ m.key }}{% endif %}</td>
<td class="mono preview">{% if m.value_hex %}<div class="muted">{{ m.value_bytes | count_text }} bytes, not UTF-8:</div>
{#- no text between the blocks: the cell keeps white space #}<table class="hex">{% for hex, text in m.value_hex %}<tr><td class="bytes">{{ hex }}</td><td class="text">{{ text }}</td></tr>{% endfor %}</table>{% if m.value_bytes > m.value_hex | length * 16 %}<div class="muted">…</div>{% endif %}
{%- else %}{{ m.value }}{% if m.value_bytes is not none %}<div class="muted">{{ m.value_bytes | count_text }} bytes</div>{% endif %}{% endif %}</td>
<td class="reason">{{ m.reason }}{% if m.replayed %} <span class="muted">[replayed]</span>{% endif %}</td>
<td class="num">{% if m.schema_version is not none %}v{{ m.schema_version }}{% endif %}</td>
<td class="at">{{ m.quarantined_at | when }}</td></tr>{% endfor %}</table>
{% elif q.exists and not q.problem %}<p class="muted">The quarantine is empty.</p>
{% else %}<p class="muted">Nothing quarantined: no quarantine table yet.</p>{% endif %}
{% endblock %}
"""

REPLAY = """{% extends "base.html" %}
{% block title %}{{ topic }}: replay{% endblock %}
{% block body %}
<h1>{{ topic }}: replay the quarantine</h1>
{% include "tabs.html" %}
{% if run_id %}<div class="done" id="replay-started">Replay started: run <a id="replay-run" href="{{ run_url }}"><code>{{ run_id }}</code></a> of {{ dag_id }}
replays the quarantined messages not replayed yet ({{ which.text() }}). Its ingest task's log and result say what landed; the quarantine page marks them <span class="muted">[replayed]</span>.</div>
<p><a href="{{ here }}{{ back }}">Back to the quarantine</a></p>
{% else %}<p>A run of <code>{{ dag_id }}</code> will read the quarantined messages again through the topic's decoder and land those that now parse in the table, exactly once
(as <code>deltaferry quarantine replay {{ topic }}</code> does); those that still fail stay in the quarantine.</p>
<p id="replay-what">Messages: {{ which.text() }}, not replayed yet: <strong>{{ waiting | count_text }}</strong> now.</p>
<form method="post" action="{{ here }}/replay" id="replay-confirm">
<input type="hidden" name="form_token" value="{{ form_token }}">
{% if which.reason is not none %}<input type="hidden" name="reason" value="{{ which.reason }}">{% endif %}
{% if which.partition is not none %}<input type="hidden" name="partition" value="{{ which.partition }}">{% endif %}
{% if which.key is not none %}<input type="hidden" name="key" value="{{ which.key }}">{% endif %}
{% if which.contract %}<input type="hidden" name="contract" value="1">{% endif %}
<button type="submit" class="replay" id="replay-confirm-button">Start the replay run</button>
<a href="{{ here }}{{ back }}" id="replay-cancel">Cancel</a>
</form>{% endif %}
{% endblock %}
"""

HEALTH = """{% extends "base.html" %}
{% block title %}{{ topic }}: table health{% endblock %}
{% block body %}
<h1>{{ topic }}: table health</h1>
{% include "tabs.html" %}
{% if not show_tabs %}<p class="sub"><a id="runs-link" href="{{ root }}/dags/{{ dag_id | urlencode }}/runs">Ingest runs</a>: the latest runs' figures as charts.</p>{% endif %}
<dl class="facts" id="maintenance">
<dt>next OPTIMIZE</dt><dd class="next-optimize">{{ due.optimize }}</dd>
<dt>next VACUUM</dt><dd class="next-vacuum">{{ due.vacuum | when }}</dd>
</dl>
{% macro by(t, c) -%}
{% if c.task %}<a class="by-run" href="{{ run_url(airflow, c.task.dag_id, c.task.run_id) }}">{{ c.task.run_id }}</a>
<a class="by-task" href="{{ task_url(airflow, c.task.dag_id, c.task.run_id, c.task.task_id, c.task.try_number, c.task.map_index) }}">{{ c.task.task_id }}{% if c.task.try_number and c.task.try_number > 1 %} (try {{ c.task.try_number }}){% endif %}</a>{% else %}<span class="muted">not an Airflow run</span>{% endif %}
{%- endmacro %}
{% for t in tables %}
<h2>{{ t.name }} <span class="muted mono">{{ t.location }}</span></h2>
{% if not t.exists %}<p class="muted">No Delta table here yet.</p>{% else %}
<dl class="facts" id="facts-{{ t.name }}">
<dt>Delta version</dt><dd class="version">{{ t.version }}</dd>
<dt>last changed by</dt><dd class="last-by">{% if t.commits and t.commits[0].task %}{{ by(t, t.commits[0]) }} <span class="muted">(version {{ t.commits[0].version }})</span>{% elif t.last_by_airflow %}{{ by(t, t.last_by_airflow) }} <span class="muted">(version {{ t.last_by_airflow.version }}; newer versions were not made by an Airflow run)</span>{% else %}<span class="muted">no Airflow run in the history read</span>{% endif %}</dd>
<dt>layout</dt><dd class="layout">{{ t.layout }}</dd>
<dt>rows</dt><dd class="rows">{{ t.rows | count_text }}</dd>
<dt>files now</dt><dd class="files">{{ t.files | count_text }} ({{ t.bytes | bytes_text }}) <span class="muted">in the current version; a commit's numFiles counts the files that commit wrote</span></dd>
<dt>small files</dt><dd>{{ t.small_files | count_text }} below {{ small_file_bytes | bytes_text }}; OPTIMIZE compacts from {{ optimize_min_files }} on (optimize_min_files)</dd>
<dt>last OPTIMIZE</dt><dd>{{ (t.last_optimize | when) or "never" }}</dd>
<dt>last VACUUM</dt><dd>{{ (t.last_vacuum | when) or "never" }}</dd>
{% if t.column_mapping %}<dt>column mapping</dt><dd>{{ t.column_mapping }}</dd>{% endif %}
</dl>
<table class="history" id="history-{{ t.name }}"><tr><th class="num">version</th><th>when</th><th>operation</th><th>metrics</th><th>made by</th><th>engine</th></tr>
{% for c in t.commits %}<tr data-version="{{ c.version }}"><td class="num">{{ c.version }}</td><td>{{ c.at | when }}</td><td class="operation">{{ c.operation }}{% if c.note %}<div class="muted note-what">{{ c.note }}</div>{% endif %}</td>
<td class="mono">{{ c.metrics }}</td><td class="by">{{ by(t, c) }}</td><td class="muted">{{ c.engine }}</td></tr>{% endfor %}</table>
{% endif %}{% endfor %}
{% endblock %}
"""

RUNS = """{% extends "base.html" %}
{% block title %}{{ topic }}: run history{% endblock %}
{% block body %}
<h1>{{ topic }}: run history</h1>
{% include "tabs.html" %}
<p class="sub">The latest {{ r.runs | length }} run(s) of <code>{{ r.dag_id }}</code>, oldest on the left; each figure from the run's ingest report
(a run without one, failed before ingest reported or still running, has no mark). Hover a mark for its run.</p>
{% if not r.runs %}<p class="muted">No run of {{ r.dag_id }} yet.</p>{% else %}
{% for c in r.charts %}<h2>{{ c.title }} <span class="muted">({{ c.unit }})</span></h2>
<svg id="chart-{{ c.key }}" class="chart" data-points="{{ c.points }}" data-runs="{{ c.runs }}"
  width="{{ c.width }}" height="{{ c.height }}" viewBox="0 0 {{ c.width }} {{ c.height }}" role="img" aria-label="{{ c.title }}">
{% for y, label in c.ticks %}<line x1="{{ c.left }}" x2="{{ c.width - 8 }}" y1="{{ y }}" y2="{{ y }}" stroke="{{ '#a0aec0' if loop.first else '#e2e8f0' }}"/>
<text x="{{ c.left - 6 }}" y="{{ y + 4 }}" text-anchor="end">{{ label }}</text>
{% endfor %}{% for b in c.bars %}<rect class="bar" x="{{ b.x }}" y="{{ b.y }}" width="{{ b.width }}" height="{{ b.height }}" fill="{{ b.fill }}"><title>{{ b.title }}</title></rect>
{% endfor %}{% for line in c.lines %}<polyline class="line" points="{{ line }}" fill="none" stroke="#2b6cb0" stroke-width="1.5"/>
{% endfor %}{% for d in c.dots %}<circle class="point" cx="{{ d.x }}" cy="{{ d.y }}" r="3" fill="#2b6cb0"><title>{{ d.title }}</title></circle>
{% endfor %}<text x="{{ c.left }}" y="{{ c.height - 5 }}">{{ c.first }}</text>
<text x="{{ c.width - 8 }}" y="{{ c.height - 5 }}" text-anchor="end">{{ c.last }}</text>
</svg>
{% if c.legend %}<p class="legend">{% for colour, phase in c.legend %}<span class="item"><span class="swatch" style="background: {{ colour }}"></span>{{ phase }}</span>{% endfor %}</p>{% endif %}
{% endfor %}
<h2>Runs</h2>
<table id="runs"><tr><th>run</th><th>state</th><th>when</th><th>ingest</th></tr>
{% for run in r.runs %}<tr data-run="{{ run.run_id }}"><td class="mono"><a class="run" href="{{ run_url(airflow, r.dag_id, run.run_id) }}">{{ run.run_id }}</a>
<div><a class="log" href="{{ task_url(airflow, r.dag_id, run.run_id, ingest_task) }}">ingest log</a></div></td><td><span class="state-{{ run.state }}">{{ run.state }}</span></td>
<td>{{ run.at }}</td><td class="mono" style="max-width:520px">{{ run.result }}</td></tr>{% endfor %}</table>
{% endif %}
{% endblock %}
"""

RESUMED = """{% extends "base.html" %}
{% block title %}{{ topic }}: resume{% endblock %}
{% block body %}
<h1>{{ topic }}: resume</h1>
{% if paused %}<div class="done" id="resumed">Resumed: {{ topic }} was paused since {{ paused.since }} ({{ paused.why() }}).
Its next run reads the topic again.</div>
{% else %}<p id="not-paused">{{ topic }} is not paused: nothing to resume.</p>{% endif %}
<p><a href="{{ root }}/">All topics</a> · <a href="{{ root }}/topics/{{ topic | urlencode }}/quarantine">its quarantine</a></p>
{% endblock %}
"""

ERROR = """{% extends "base.html" %}
{% block title %}deltaferry: {{ status }}{% endblock %}
{% block body %}<h1>{{ title }}</h1><p>{{ message }}</p>
{% if show_tabs %}<p><a href="{{ root }}/">All topics</a></p>{% endif %}{% endblock %}
"""

TEMPLATES = {"base.html": BASE, "tabs.html": TOPIC_TABS, "topics.html": TOPICS,
             "schema.html": SCHEMA, "quarantine.html": QUARANTINE, "health.html": HEALTH,
             "runs.html": RUNS, "error.html": ERROR, "replay.html": REPLAY,
             "resumed.html": RESUMED}
