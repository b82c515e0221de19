"""Topic names: the Kafka-on-Pulsar mapping (DESIGN §4, seed 003) and the on-disk form.

Accepted spellings, all meaning the same three parts (tenant, namespace, local name):

    name                              -> persistent://public/default/name
    tenant/namespace/name             -> persistent://tenant/namespace/name
    persistent://tenant/namespace/name

The default tenant and namespace (seed 003's kafkaTenant and kafkaNamespace) are a setting of
the cluster, public/default unless `tq up` or `tq coordinator` was given `--tenant` and
`--namespace` when the cluster was first started: `set_default_namespace` makes a process
resolve a bare name (and show a short one) the cluster's way; the coordinator calls it at start,
every client once its session is open (DESIGN §4). System names (`__...`) always mean
public/default.

Each part is made of Kafka's legal topic characters (letters, digits, `.`, `_`, `-`), so a name in
the default namespace is also a legal Kafka topic name and Kafka clients see it unchanged. Local
names starting with `__` are internal (system topics such as `__catalog.topics`, `__logs`,
`__consumer_offsets`).

The on-disk form names partition directories `<dir_name>-<partition>`: the name relative to
public/default (whatever the cluster's default) with each `/` written as `%2F`. `%` is not a
legal name character, so the mapping is reversible and a directory name never contains `/`.
Names in public/default keep Kafka's own layout (`numbers-0`).

Pure string work: no I/O. Every input is bounded before any regex runs.
"""

from __future__ import annotations

import re

import msgspec

from catalog.errors import InvalidTopicNameError

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_TENANT",
    "MAX_TOPIC_NAME_LENGTH",
    "TopicName",
    "default_namespace",
    "set_default_namespace",
]

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PERSISTENT_SCHEME = "persistent://"
# Kafka's limit for a topic name; we apply it to the display form and to the directory form so a
# partition directory (`<dir_name>-<partition>`) stays under the 255-byte file-name limit.
MAX_TOPIC_NAME_LENGTH = 249
_DIR_SLASH = "%2F"
_PART = re.compile(r"[A-Za-z0-9._-]+")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._-]")
# Longest input worth parsing at all: the scheme plus a maximal name. Anything longer is rejected
# before splitting, so hostile input costs O(limit).
_MAX_INPUT = len(PERSISTENT_SCHEME) + 2 * MAX_TOPIC_NAME_LENGTH
# The cluster's default (tenant, namespace): what a bare name means. One per process (a
# process belongs to one cluster); set by the coordinator at start and by clients on connect.
_default: tuple[str, str] = (DEFAULT_TENANT, DEFAULT_NAMESPACE)


def default_namespace() -> tuple[str, str]:
    """The (tenant, namespace) a bare topic name means in this process."""
    return _default


def set_default_namespace(tenant: str, namespace: str) -> None:
    """Make bare topic names mean `tenant/namespace/NAME` in this process (and short names
    drop that prefix). InvalidTopicNameError for a tenant or namespace that is not a name."""
    global _default
    text = f"{tenant}/{namespace}"
    _check_part(text, tenant, "tenant")
    _check_part(text, namespace, "namespace")
    _default = (tenant, namespace)


def _valid_forms() -> str:
    return ("a valid topic name is NAME, TENANT/NAMESPACE/NAME or "
            "persistent://TENANT/NAMESPACE/NAME, each part made of letters, digits, '.', '_' "
            f"and '-' (NAME alone means {_default[0]}/{_default[1]}/NAME)")


def _refuse(text: object, why: str) -> InvalidTopicNameError:
    shown = repr(text) if not isinstance(text, str) or len(text) <= 80 else repr(text[:80] + "...")
    return InvalidTopicNameError(f"invalid topic name {shown}: {why}; {_valid_forms()}")


def _check_part(text: str, part: str, what: str) -> None:
    if not part:
        raise _refuse(text, f"the {what} is empty")
    if part in (".", ".."):
        raise _refuse(text, f"the {what} may not be '.' or '..'")
    if _PART.fullmatch(part) is None:
        bad = _BAD_CHAR.search(part)
        assert bad is not None
        raise _refuse(text, f"the {what} contains {bad.group()!r}")


def _fixed_short(tenant: str, namespace: str, local: str) -> str:
    """The name relative to public/default, whatever the cluster's default: the disk form."""
    if tenant == DEFAULT_TENANT and namespace == DEFAULT_NAMESPACE:
        return local
    return f"{tenant}/{namespace}/{local}"


def _bare_means(local: str) -> tuple[str, str]:
    """The (tenant, namespace) a bare `local` name resolves to: the cluster's default, or
    public/default for a system name."""
    return (DEFAULT_TENANT, DEFAULT_NAMESPACE) if local.startswith("__") else _default


def _check_parts(text: str, tenant: str, namespace: str, local: str) -> None:
    _check_part(text, tenant, "tenant")
    _check_part(text, namespace, "namespace")
    _check_part(text, local, "name")
    if len(_fixed_short(tenant, namespace, local).replace("/", _DIR_SLASH)) > \
            MAX_TOPIC_NAME_LENGTH:
        raise _refuse(text, f"longer than {MAX_TOPIC_NAME_LENGTH} characters")


class TopicName(msgspec.Struct, frozen=True, order=True):
    """A parsed, valid topic name. Build it with `TopicName.parse`; the fields are checked."""

    tenant: str
    namespace: str
    local: str

    def __post_init__(self) -> None:
        text = f"{self.tenant}/{self.namespace}/{self.local}"
        _check_parts(text, self.tenant, self.namespace, self.local)

    @classmethod
    def parse(cls, text: str, *, fixed: bool = False) -> TopicName:
        """Parse any accepted spelling; raise InvalidTopicNameError saying what a valid one is.
        A bare name means the cluster's default namespace (`fixed`: public/default, as in the
        disk form)."""
        if not isinstance(text, str):
            raise _refuse(text, f"expected a string, got {type(text).__name__}")
        if not text:
            raise _refuse(text, "the name is empty")
        if len(text) > _MAX_INPUT:
            raise _refuse(text, f"longer than {MAX_TOPIC_NAME_LENGTH} characters")
        rest = text
        if "://" in text:
            scheme, _, rest = text.partition("://")
            if scheme == "non-persistent":
                raise _refuse(text, "non-persistent topics are not supported")
            if scheme != "persistent":
                raise _refuse(text, f"unknown scheme {scheme + '://'!r}")
            parts = rest.split("/")
            if len(parts) != 3:
                raise _refuse(text, "persistent:// must be followed by TENANT/NAMESPACE/NAME")
        else:
            parts = rest.split("/")
            if len(parts) == 1:
                tenant, namespace = (DEFAULT_TENANT, DEFAULT_NAMESPACE) if fixed else \
                    _bare_means(parts[0])
                parts = [tenant, namespace, parts[0]]
            elif len(parts) != 3:
                raise _refuse(text, f"{len(parts) - 1} '/' found, expected none or two")
        # Check with the caller's spelling in the message, before __post_init__ checks again.
        _check_parts(text, *parts)
        return cls(*parts)

    @property
    def full(self) -> str:
        """The canonical form, `persistent://tenant/namespace/name`; the catalog stores this."""
        return f"{PERSISTENT_SCHEME}{self.tenant}/{self.namespace}/{self.local}"

    @property
    def short(self) -> str:
        """The display form and the Kafka-visible name: `name` in the cluster's default
        namespace (public/default for system names), else T/NS/N."""
        if (self.tenant, self.namespace) == _bare_means(self.local):
            return self.local
        return f"{self.tenant}/{self.namespace}/{self.local}"

    @property
    def fixed_short(self) -> str:
        """The short form relative to public/default, whatever the cluster's default: how a
        reader of a data dir, which has no cluster to ask, names the topic."""
        return _fixed_short(self.tenant, self.namespace, self.local)

    @property
    def internal(self) -> bool:
        """System topics (`__catalog.*`, `__logs`, `__consumer_offsets`) start with `__`."""
        return self.local.startswith("__")

    @property
    def dir_name(self) -> str:
        """The directory-safe form: the name relative to public/default (not to the cluster's
        default: the disk layout never depends on it) with `/` as `%2F`. Never contains `/`."""
        return self.fixed_short.replace("/", _DIR_SLASH)

    def partition_dir(self, partition: int) -> str:
        """The name of one partition's directory, `<dir_name>-<partition>`, as Kafka lays it out."""
        if partition < 0:
            raise InvalidTopicNameError(f"partition must be >= 0, got {partition}")
        return f"{self.dir_name}-{partition}"

    @classmethod
    def from_dir_name(cls, dir_name: str) -> TopicName:
        """Invert `dir_name`. Only the canonical directory form is accepted (one spelling each)."""
        if "/" in dir_name:
            raise _refuse(dir_name, "a directory name never contains '/'")
        name = cls.parse(dir_name.replace(_DIR_SLASH, "/"), fixed=True)
        if name.dir_name != dir_name:
            raise _refuse(dir_name, f"not the canonical directory form (that is {name.dir_name!r})")
        return name

    @classmethod
    def parse_partition_dir(cls, dir_name: str) -> tuple[TopicName, int]:
        """Invert `partition_dir`: `numbers-3` -> (public/default/numbers, 3)."""
        topic, dash, partition = dir_name.rpartition("-")
        if (
            not dash
            or not (partition.isascii() and partition.isdigit())
            or len(partition) > 10
            or str(int(partition)) != partition
        ):
            raise _refuse(dir_name, "a partition directory is <topic>-<partition number>")
        return cls.from_dir_name(topic), int(partition)

    def __str__(self) -> str:
        return self.full
