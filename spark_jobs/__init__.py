"""The spark-submit entry points, one thin script per step (see deltaferry.steps and
deltaferry.jobs). They live at the top of the checkout, where a Spark user looks for them, and an
installed wheel carries them inside the package as `deltaferry.spark_jobs` (pyproject.toml's
package-dir): `deltaferry.steps.Step.script` is the path of each, wherever deltaferry is."""
