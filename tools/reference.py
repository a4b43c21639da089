"""Where `make reference-deps` put the reference tools (Kafka's jars, the Java driver, franz-go).

Nothing here downloads: a missing piece raises RuntimeError saying which make target builds it,
so a reference test fails loudly instead of skipping.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE = Path(os.environ.get("HERD_REF_CACHE") or Path.home() / ".cache" / "herd-ref")
JAVA_LIB = CACHE / "java" / "lib"
JAVA_CLASSES = CACHE / "java" / "java-build" / "classes"
FRANZ_MEMBER = CACHE / "go" / "franz-member"


class MissingReference(RuntimeError):
    pass


def java() -> str:
    exe = shutil.which("java")
    if exe is None:
        raise MissingReference("no java on PATH: install a JDK 17+ (make test does, as root with apt-get)")
    return exe


def classpath(with_driver: bool = False) -> str:
    if not (JAVA_LIB / "kafka_2.13-4.4.0.jar").exists() and not any(JAVA_LIB.glob("kafka_2.13-*.jar")):
        raise MissingReference(f"Kafka's jars are not in {JAVA_LIB}: run `make reference-deps` "
                               "(needs Maven and a JDK; make test runs it)")
    parts = [str(JAVA_LIB / "*")]
    if with_driver:
        if not (JAVA_CLASSES / "herd" / "ref" / "Driver.class").exists():
            raise MissingReference(f"the Java driver is not built in {JAVA_CLASSES}: run `make reference-deps`")
        parts.insert(0, str(JAVA_CLASSES))
    return os.pathsep.join(parts)


def franz_member() -> str:
    if not FRANZ_MEMBER.exists():
        raise MissingReference(f"the franz-go driver is not built at {FRANZ_MEMBER}: run `make reference-deps` "
                               "(needs Go >= 1.26)")
    return str(FRANZ_MEMBER)
