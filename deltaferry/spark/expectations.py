"""A topic's expectations (``expectations:`` in the topics file, `deltaferry.config.Expectation`)
evaluated on a micro-batch's decoded records, in the batch's one pass.

Each rule is a Spark SQL boolean expression over the row as its table will hold it (the table
writer's `columns`: Kafka's columns, the payload's fields under their column names, a cdc
topic's source columns). Only usable records that make a row are checked (the writer's
`checked`): a record already on its way to the quarantine, a tombstone or a cdc delete is not.

A record fails an expectation when its rule is false. A rule that is NULL (``amount >= 0`` with
``amount`` null) passes, as in Databricks' pipeline expectations and SQL CHECK constraints:
write ``amount IS NOT NULL AND amount >= 0`` to require the field.

`check` adds one boolean column per expectation (`failed_column`) and, for the records that
fail a quarantine expectation (and, in a replay, a fail one), the reason naming the first such
expectation; `tally` counts the failures per expectation (and the first offset of each) in the
same aggregation that counts the quarantined records, so a topic with expectations costs no
extra Spark job, and a topic without any is not touched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltaferry.config import Expectation, TopicConfig
from deltaferry.errors import ConfigError, DeltaferryError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The columns a batch's records carry through `check` (names no payload field is likely to
#: have; a rule cannot name them).
RECORD = "__deltaferry_record"
CHECKED = "__deltaferry_checked"


#: The key of `Checker.tally`'s counts for the bad messages: records with a reason that is
#: not an expectation's (no expectation's name: those start with a letter).
BAD_MESSAGES = "(bad messages)"


def failed_column(index: int) -> str:
    """The boolean column of the `index`-th expectation: true where the record failed it."""
    return f"__deltaferry_expectation_{index}"


class ExpectationRuleError(ConfigError):
    """A rule Spark cannot evaluate on the topic's rows (it does not parse, names an unknown
    column, is not boolean): the topic's configuration error, raised before the batch writes."""

    def __init__(self, topic: str, expectation: Expectation, problem: str):
        self.expectation = expectation
        super().__init__(f"topic {topic}: expectation {expectation.name} (rule "
                         f"{expectation.rule!r})", f"{problem}; fix the rule in the topics file",
                         topic=topic)


class ExpectationFailedError(DeltaferryError):
    """A record failed an expectation whose action is fail: nothing of the micro-batch was
    written (table, quarantine, checkpoint)."""

    exit_code = 3

    def __init__(self, topic: str, batch_id: int, failures: list[tuple[Expectation, int, str]]):
        self.topic = topic
        self.failures = failures
        said = "; ".join(f"expectation {e.name} ({e.rule}) failed for {count} record(s), e.g. "
                         f"{example}" for e, count, example in failures)
        super().__init__(f"ingest {topic}: {said}; micro-batch {batch_id} was not written (table, "
                         "quarantine and checkpoint unchanged): fix the data or the rule, or "
                         "make the action quarantine, then run again")


class BadMessageError(DeltaferryError):
    """A message of a topic whose ``on_bad_messages`` is fail could not be used (it would have
    gone to the quarantine): nothing of the micro-batch was written (table, quarantine,
    checkpoint), as for a fail expectation (`ExpectationFailedError`)."""

    exit_code = 3

    def __init__(self, topic: str, batch_id: int, count: int, first: str):
        self.topic = topic
        super().__init__(f"ingest {topic}: bad message at {first} ({count} in the micro-batch); "
                         f"on_bad_messages is fail, so micro-batch {batch_id} was not written "
                         "(table, quarantine and checkpoint unchanged): fix the producer or "
                         "the schema, or make on_bad_messages quarantine, then run again")


def spark_problem(exc: Exception) -> str:
    """What Spark said, on one line: the error class and the message, without the Java
    exception's name and the position Spark appends to an analysis error."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    if ": [" in text and not text.startswith("["):  # py4j: "org.apache...Exception: [CLASS] ..."
        text = text[text.index(": [") + 2:]
    return re.sub(r";\s*line \d+ pos \d+;?$", "", text).rstrip("; ")


def needs_checker(topic: TopicConfig) -> bool:
    """Whether ingest checks `topic`'s batches with a `Checker`: it has expectations, or its
    bad messages are counted apart from them (``on_bad_messages`` fail or pause_after)."""
    return bool(topic.expectations) or topic.on_bad_messages != "quarantine"


@dataclass
class Checker:
    """The expectations of one topic, for one query: `check` and `tally` per micro-batch. The
    rules are resolved against a batch's columns the first time a schema is seen (a rule Spark
    cannot evaluate raises `ExpectationRuleError` then, before anything of the batch is
    written). The records with a reason of their own (not an expectation's) are counted too,
    `BAD_MESSAGES`; a topic whose ``on_bad_messages`` is fail is refused the same way when the
    batch has one. A topic needs a checker for its expectations or its ``on_bad_messages``
    (`needs_checker`)."""

    topic: TopicConfig
    #: The schemas (as JSON) the rules were resolved against already.
    _resolved: set[str] = field(default_factory=set)

    @property
    def expectations(self) -> tuple[Expectation, ...]:
        return self.topic.expectations

    def parse_rules(self, spark: SparkSession) -> None:
        """Parse each rule with `spark`'s SQL parser (no schema, no job):
        `ExpectationRuleError` for one that does not parse, so a broken rule fails the run
        before any batch is planned. (`F.expr` parses only when its column is resolved.)"""
        session = getattr(spark, "_jsparkSession", None)
        if session is None:  # not a classic session: each batch's `resolve` still parses
            return
        parser = session.sessionState().sqlParser()
        for expectation in self.expectations:
            try:
                parser.parseExpression(expectation.rule)
            except Exception as exc:  # Spark's ParseException through py4j
                raise ExpectationRuleError(self.topic.name, expectation,
                                           f"Spark cannot parse it: {spark_problem(exc)}") \
                    from None

    def resolve(self, rows: DataFrame) -> None:
        """Resolve every rule against `rows` (the table columns of a batch) unless this schema
        was seen: `ExpectationRuleError` naming the expectation and what Spark said."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import BooleanType

        key = rows.schema.json()
        if key in self._resolved:
            return
        for expectation in self.expectations:
            try:
                datatype = rows.select(F.expr(expectation.rule).alias("r")).schema["r"].dataType
            except Exception as exc:  # AnalysisException, ParseException
                raise ExpectationRuleError(self.topic.name, expectation,
                                           f"Spark says: {spark_problem(exc)}") from None
            if not isinstance(datatype, BooleanType):
                raise ExpectationRuleError(
                    self.topic.name, expectation,
                    f"it is not a boolean expression (it gives {datatype.simpleString()})")
        self._resolved.add(key)

    def check(self, parsed: DataFrame, columns: Sequence[Column], checked: Column,
              replay: bool = False) -> DataFrame:
        """`parsed` with each expectation's `failed_column` (true where a checked record's rule
        is false) and, for a record that fails a quarantine expectation (or, if `replay`, a fail
        one: a replay lands nothing an ingest would refuse), the reason naming the first such
        expectation. `columns` are the table columns of a record (what rules see), `checked`
        whether the record is checked (the table writer's); a usable record only."""
        from pyspark.sql import functions as F

        if not self.expectations:
            return parsed
        names = parsed.columns
        is_checked = F.col("reason").isNull() & F.coalesce(checked, F.lit(False))
        view = parsed.select(F.struct(*[F.col(f"`{c}`") for c in names]).alias(RECORD),
                             is_checked.alias(CHECKED), *columns)
        self.resolve(view.drop(RECORD, CHECKED))
        failed = {failed_column(i): F.col(CHECKED) & F.coalesce(~F.expr(e.rule), F.lit(False))
                  for i, e in enumerate(self.expectations)}
        view = view.select(RECORD, *[c.alias(name) for name, c in failed.items()])
        sent = ("quarantine", "fail") if replay else ("quarantine",)
        reason: Column = F.col(f"{RECORD}.reason")
        refusing = [(i, e) for i, e in enumerate(self.expectations) if e.action in sent]
        if refusing:
            first = F.coalesce(*[F.when(F.col(failed_column(i)), F.lit(e.reason))
                                 for i, e in refusing])
            reason = F.coalesce(reason, first)
        return view.select(*[reason.alias("reason") if c == "reason"
                             else F.col(f"{RECORD}.`{c}`").alias(c) for c in names],
                           *failed)

    def tally_columns(self) -> list[Column]:
        """Aggregate columns of a checked batch: per expectation, the records that failed it
        and the first (partition, offset) of them; then the bad messages (a reason that is not
        an expectation's) and the first of them with its reason."""
        from pyspark.sql import functions as F

        found = []
        for i in range(len(self.expectations)):
            flag = F.col(failed_column(i))
            found.append(F.count_if(flag))
            found.append(F.min(F.when(flag, F.struct("kafka_partition", "kafka_offset"))))
        bad = F.col("reason").isNotNull()  # a reason, and no expectation failed (none checked it)
        for i in range(len(self.expectations)):
            bad = bad & ~F.col(failed_column(i))
        found.append(F.count_if(bad))
        found.append(F.min(F.when(bad, F.struct("kafka_partition", "kafka_offset", "reason"))))
        return found

    @property
    def fails_on_bad_messages(self) -> bool:
        """Whether a bad message stops the run (``on_bad_messages: fail``)."""
        return self.topic.on_bad_messages == "fail"

    def tally(self, values: Sequence) -> dict[str, tuple[int, str]]:
        """The aggregated `values` (`tally_columns`' order) as expectation name -> (records
        that failed it, the first one as ``partition P offset O``, or ""), and `BAD_MESSAGES`
        -> (bad messages, the first one with its reason, or "")."""
        result = {}
        for i, expectation in enumerate(self.expectations):
            count, first = values[2 * i], values[2 * i + 1]
            example = f"partition {first[0]} offset {first[1]}" if first is not None else ""
            result[expectation.name] = (int(count or 0), example)
        count, first = values[-2], values[-1]
        example = f"partition {first[0]} offset {first[1]}: {first[2]}" if first is not None \
            else ""
        result[BAD_MESSAGES] = (int(count or 0), example)
        return result

    def refuse(self, batch_id: int, counts: dict[str, tuple[int, str]]) -> None:
        """Raise `ExpectationFailedError` if a record of the batch failed a fail expectation,
        else `BadMessageError` if it had a bad message and ``on_bad_messages`` is fail."""
        failures = [(e, *counts[e.name]) for e in self.expectations
                    if e.action == "fail" and counts[e.name][0]]
        if failures:
            raise ExpectationFailedError(self.topic.name, batch_id, failures)
        bad, first = counts.get(BAD_MESSAGES, (0, ""))
        if bad and self.fails_on_bad_messages:
            raise BadMessageError(self.topic.name, batch_id, bad, first)


def counts_of(topic: TopicConfig,
              counts: dict[str, tuple[int, str]] | None = None) -> dict[str, dict]:
    """A report's ``expectations`` (name -> {action, failed}) for the topic's expectations: the
    failures of a batch's `counts` (`tally`'s), or zeros without them."""
    counts = counts or {}
    return {e.name: {"action": e.action, "failed": counts.get(e.name, (0, ""))[0]}
            for e in topic.expectations}


def add_counts(into: dict[str, dict], topic: TopicConfig,
               counts: dict[str, tuple[int, str]]) -> None:
    """Add a batch's `counts` to a report's ``expectations`` (name -> {action, failed})."""
    for name, batch in counts_of(topic, counts).items():
        into.setdefault(name, {**batch, "failed": 0})["failed"] += batch["failed"]
