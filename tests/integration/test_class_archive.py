"""The driver JVM of a run maps the class archive `make setup` built (deltaferry.spark.
class_archive): checked in the running JVM itself, by its own diagnostic commands (what `jcmd`
would ask it, without needing the JDK's jcmd: a Java runtime alone runs this test)."""

import re

import pytest

from deltaferry.jvm import archive_path

pytestmark = pytest.mark.integration


def vm_info(spark) -> str:
    """`VM.info` of the driver JVM, through its DiagnosticCommand MBean (jdk.management, part
    of every Java runtime). Called through the public MBeanServer interface's Method: py4j would
    look the method up on the server's class, which its module does not export."""
    jvm = spark._jvm
    gateway = spark.sparkContext._gateway

    def array(kind, *items):
        made = gateway.new_array(kind, len(items))
        for i, item in enumerate(items):
            made[i] = item
        return made

    klass = jvm.java.lang.Class
    invoke = klass.forName("javax.management.MBeanServer").getMethod("invoke", array(
        klass, *(klass.forName(n) for n in ("javax.management.ObjectName", "java.lang.String",
                                            "[Ljava.lang.Object;", "[Ljava.lang.String;"))))
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    name = jvm.javax.management.ObjectName("com.sun.management:type=DiagnosticCommand")
    no_arguments = array(jvm.java.lang.String)
    info = invoke.invoke(server, array(
        jvm.java.lang.Object, name, "vmInfo", array(jvm.java.lang.Object, no_arguments),
        array(jvm.java.lang.String, "[Ljava.lang.String;")))
    return str(info)


def test_the_driver_maps_the_class_archive(spark):
    archive = archive_path()
    assert archive is not None and archive.is_file(), "make setup builds the class archive"
    jvm = spark._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                     .getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    assert "-XX:TieredStopAtLevel=1" in arguments  # a run's own driver: C1 (warm ones: C2)
    info = vm_info(spark)
    mapped = re.search(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)
    assert mapped, "CDS is off in the driver"
    # the JDK's own base archive is ~13 MB; the dynamic archive on top of it is mapped too
    assert int(mapped.group(1)) >= archive.stat().st_size


def test_delta_and_kafka_classes_load_from_the_drivers_class_path(spark):
    """Only classes of the JVM's own class path come from the archive: Delta's and the Kafka
    client's (most of a run's own classes) are loaded by the application class loader, not by
    Spark's loader of spark.jars, which the archive does not serve."""
    jvm = spark._jvm
    system = jvm.java.lang.ClassLoader.getSystemClassLoader()
    for name in ("org.apache.spark.sql.delta.DeltaLog",
                 "org.apache.kafka.clients.consumer.KafkaConsumer",
                 "org.apache.spark.sql.kafka010.KafkaSourceProvider"):
        loader = jvm.java.lang.Class.forName(name).getClassLoader()
        assert loader.equals(system), f"{name}: loaded by {loader.toString()}"
