"""A run's resolved settings, typed: what gcl.config.resolve_run makes of params.yaml, check@runs writes to
resolved/runs/<run>.json (its JSON form, `to_json`, the wire format other readers share) and a train stage reads
back (`ResolvedRun.model_validate`) and trains (gcl.training.run.train_run)."""
from __future__ import annotations

from pydantic import Field, SerializeAsAny, field_validator

from gcl.core.settings import Settings
from gcl.data.benchmarks import KINDS, DataSettings, TrainingSettings
from gcl.methods import METHODS
from gcl.methods.base import RunSettings


def _kind(value: dict) -> type:
    kind = value.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown benchmark kind {kind!r}; known kinds: {sorted(KINDS)}")
    return KINDS[kind]


class ResolvedRun(Settings):
    """One run, every setting resolved: defaults, then the method's block, then the run's own."""

    key: str = Field(description="the run's key under runs")
    # the run's flat settings: benchmark, method, buffer, algorithm, then the method's settings (its method's Run)
    run: SerializeAsAny[RunSettings]
    # the benchmark's training settings (its kind's Training), with the run's epochs and width
    benchmark: SerializeAsAny[TrainingSettings]
    # the benchmark's data settings (its kind's Data): what its benchmark file was built from
    data: SerializeAsAny[DataSettings]
    seeds: list[int] = Field(description="the seeds the run is repeated over")
    device: str = Field(description="auto, cpu, cuda or cuda:N")
    # the digest of the code train stages run (gcl.core.fingerprint.train_code_digest): check@runs adds it to the
    # file it writes, and train@ compares it; never part of to_json
    code: str | None = Field(None, exclude=True)

    @field_validator("run", mode="before")
    @classmethod
    def _run(cls, value):
        """The JSON form read back as its algorithm's Run."""
        if isinstance(value, dict):
            algorithm = value.get("algorithm")
            if algorithm not in METHODS:
                raise ValueError(f"unknown method {algorithm!r}; known methods: {sorted(METHODS)}")
            return METHODS[algorithm].Run.model_validate(value)
        return value

    @field_validator("benchmark", mode="before")
    @classmethod
    def _training(cls, value):
        return _kind(value).Training.model_validate(value) if isinstance(value, dict) else value

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value):
        return _kind(value).Data.model_validate(value) if isinstance(value, dict) else value

    def to_json(self) -> dict:
        """The JSON form (without `code`), as resolved/runs/<run>.json holds it."""
        return self.model_dump(mode="json")
