"""The spark-submit entry points, one thin script per step (see deltaferry.steps and
deltaferry.jobs). They ship inside the package, so an installed deltaferry finds them:
`deltaferry.steps.Step.script` is the path of each."""
