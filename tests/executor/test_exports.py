"""The public surface of executor and the traits of its errors."""

import executor
from catalog.errors import TqError, UserError
from executor import (
    ArtifactMissingError,
    DigestMismatchError,
    ExecFailedError,
    FetchFailedError,
    FetchReason,
    InvalidArtifactError,
    NoFreeSlotsError,
    ProcessExistsError,
)


def test_all_names_exist_and_are_public():
    for name in executor.__all__:
        assert hasattr(executor, name), name
        assert not name.startswith("_")
    assert sorted(executor.__all__) == sorted(set(executor.__all__))


def test_the_building_blocks_are_exported():
    for name in ["ArtifactCache", "ArtifactFetcher", "SpawnSpec", "Supervisor", "LogForwarder",
                 "LoadSampler", "Slots", "LineSplitter", "host_resources", "pack_path"]:
        assert name in executor.__all__


def test_errors_are_tq_errors_with_traits():
    for cls in (ArtifactMissingError, DigestMismatchError, ExecFailedError, FetchFailedError,
                InvalidArtifactError, NoFreeSlotsError, ProcessExistsError):
        assert issubclass(cls, TqError)
    assert NoFreeSlotsError.retriable
    assert not ArtifactMissingError.retriable
    assert issubclass(InvalidArtifactError, UserError)
    assert InvalidArtifactError.exit_code == 2


def test_fetch_failures_are_retriable_by_reason():
    def error(reason: FetchReason) -> FetchFailedError:
        return FetchFailedError("x", reason=reason, source="s")

    assert error(FetchReason.TIMEOUT).retriable
    assert error(FetchReason.UNREACHABLE).retriable
    assert not error(FetchReason.NOT_FOUND).retriable
    assert not error(FetchReason.TOO_LARGE).retriable
    assert not error(FetchReason.UNSUPPORTED).retriable
    assert error(FetchReason.TOO_LARGE).reason == "too_large"


def test_exec_failed_keeps_its_reason():
    assert ExecFailedError("cannot start", reason="No such file").reason == "No such file"
    assert ExecFailedError("cannot start").reason == "cannot start"
