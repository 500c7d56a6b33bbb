"""The driver JVM of a run maps the class archive `make setup` built (deltaferry.spark.
class_archive): checked in the running JVM itself, with the JDK's jcmd."""

import re
import shutil
import subprocess

import pytest

from deltaferry.spark.class_archive import archive_path

pytestmark = pytest.mark.integration


@pytest.mark.skipif(shutil.which("jcmd") is None, reason="no jcmd (JDK) on PATH")
def test_the_driver_maps_the_class_archive(spark):
    archive = archive_path()
    assert archive is not None and archive.is_file(), "make setup builds the class archive"
    jvm = spark._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                     .getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    info = subprocess.run(["jcmd", str(jvm.ProcessHandle.current().pid()), "VM.info"],
                          capture_output=True, text=True, check=True).stdout
    mapped = re.search(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)
    assert mapped, "CDS is off in the driver"
    # the JDK's own base archive is ~13 MB; the dynamic archive on top of it is mapped too
    assert int(mapped.group(1)) >= archive.stat().st_size
