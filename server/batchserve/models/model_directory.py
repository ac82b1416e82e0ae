"""Resolving one model directory: its config, version directories, model files and their
signatures, into a completed and validated config.

Reads ``<root>/<model>/config.pbtxt`` (or, with ``--model-config-name NAME``,
``<model>/configs/NAME.pbtxt`` where that file exists, as Triton chooses; or a load's own
config), picks the versions the version policy serves, completes the config from the newest
readable model file and checks every version against it, collecting every problem of the
model rather than stopping at the first. It never loads a runtime (the registry does that).
Every file it hands out resolves, after symlinks, inside the repository root.
"""

from __future__ import annotations

import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path

from batchserve.backends.identity import identity_problems
from batchserve.backends.onnx_file import external_data_problems, read_onnx_signature
from batchserve.backends.selection import (
    FORMATS,
    IDENTITY,
    ONNX,
    PT2,
    SUPPORTED,
    ModelFormat,
    format_from_config,
    format_from_filename,
)
from batchserve.core.backend_config import BackendConfig
from batchserve.core.errors import DeviceUnavailable, ModelConfigError, ModelFileError, NotFound
from batchserve.core.repository_files import UnusableFile, follow_links
from batchserve.core.signature import ModelSignature
from batchserve.core.tensors import INT64_MAX
from batchserve.models.config_validation import (
    AUTO_COMPLETE_OFF,
    completeness_problems,
    config_problems,
    model_problems,
    without_gpu,
)
from batchserve.models.decoupled import builtin_backend, builtin_problems
from batchserve.models.ensemble_config import is_ensemble, structure_problems
from batchserve.models.labels import LabelMap, read_labels
from batchserve.models.measured_defaults import wants_tuning
from batchserve.models.model_config import (
    CONFIG_FILENAME,
    complete_config,
    parse_pbtxt,
    read_pbtxt_text,
    version_policy,
)
from batchserve.models.model_names import name_problem
from batchserve.proto.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

CONFIG_FOLDER = "configs"
"""Where a model's named configurations live (Triton's ``kModelConfigFolder``)."""

OUTSIDE = "leads outside the repository (through a symlink)"


FileStamp = frozenset[tuple[str, int, int]]
"""(path, size, modification time in ns) of each file in a directory."""


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """One served version and the file it is loaded from."""

    version: int
    model_file: Path
    stamp: FileStamp = field(default=frozenset(), compare=False)
    """Its version directory's files when it was resolved: unchanged, a reload may keep the
    version loaded and change only its instances (Triton compares the same times)."""


def directory_stamp(directory: Path) -> FileStamp:
    """Every regular file under ``directory`` (after symlinks), with its size and time."""
    found = set()
    for path in directory.rglob("*"):
        try:
            status = path.stat()
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode):
            found.add((path.relative_to(directory).as_posix(), status.st_size, status.st_mtime_ns))
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A valid model: its completed config, served versions (ascending) and output labels."""

    name: str
    config: ModelConfig
    versions: tuple[ModelVersion, ...]
    labels: LabelMap = field(default_factory=dict)
    directory: Path | None = None
    """Where the model was read from: the repository's, or a load's own files."""
    config_file: str = CONFIG_FILENAME
    """The config it was read from, as a user knows it (``m/configs/gpu.pbtxt``, or the
    load parameter): what messages about the config name."""
    tunable: bool = False
    """The config as written leaves instances and threads to the server, which measures
    them at load (``measured_defaults``)."""


class InvalidModel(ModelConfigError):
    """A model's files or config are wrong; ``problems`` holds one message per problem."""

    def __init__(self, name: str, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.name = name
        self.problems = tuple(problems)


class InvalidModelFiles(InvalidModel, ModelFileError):
    """Every problem was found in a model file (unreadable, missing, or not what the config
    says), none in the config alone."""


def resolve_model(
    root: Path,
    name: str,
    config: ModelConfig | None = None,
    *,
    config_name: str | None = None,
    auto_complete: bool = True,
    backend_config: BackendConfig | None = None,
) -> ResolvedModel:
    """The model ``name`` (a valid name) of the repository at ``root``, completed and validated.

    ``config_name``: read ``configs/<config_name>.pbtxt`` where it exists (``config`` given,
    a load's override, wins over both). ``auto_complete`` False (Triton's
    ``--disable-auto-complete-config``): nothing is filled in from the model file, so the
    config must list every tensor with its type and dims. Raises NotFound when there is no
    such directory, and InvalidModel listing every problem.
    """
    return _ModelCheck(root, name, config, config_name, auto_complete, backend_config).run()


def _pt2_signature(model_file: Path) -> ModelSignature:
    """Read through the checked loader: torch's own would run what the archive carries."""
    from batchserve.backends.torch_program import read_pt2_signature

    return read_pt2_signature(model_file)


def _escape(path: Path, root: Path) -> str | None:
    """Why ``path``, symlinks followed, is no part of the repository: it leads outside, or
    its links loop. None when it is part of it."""
    try:
        target = follow_links(path)
    except UnusableFile as exc:
        return str(exc)
    return None if target.is_relative_to(root) else OUTSIDE


def _version_dirs(model_dir: Path) -> dict[int, Path]:
    """Directories named by a positive integer in canonical form ('1', not '01'), by number."""
    found: dict[int, Path] = {}
    for entry in model_dir.iterdir():
        if _is_version_number(entry.name) and entry.is_dir():
            found[int(entry.name)] = entry
        elif entry.is_dir() and entry.name not in _NOT_VERSIONS:
            logger.warning("%s: %s", model_dir.name, _not_a_version(entry.name))
        elif entry.name != CONFIG_FILENAME:
            logger.debug("%s: ignoring %s (not a version directory)", model_dir.name, entry.name)
    return dict(sorted(found.items()))


_NOT_VERSIONS = frozenset({CONFIG_FOLDER, "warmup", "initial_state"})
"""A model's folders that are not versions, as Triton skips them (named configs, warm-up
data, sequence initial state)."""


def _not_a_version(name: str) -> str:
    """Triton's warning for a directory it does not take as a version."""
    if len(name) > 1 and name.startswith("0"):
        return (
            f"ignore version directory '{name}' which contains leading zeros in its directory name"
        )
    if name == "0":
        return "ignore version directory '0': versions start at 1"
    if name.isascii() and name.isdigit():
        return f"ignore version directory '{name}' which is past the largest version ({INT64_MAX})"
    return f"ignore version directory '{name}' which fails to convert to integral number"


def _is_version_number(name: str) -> bool:
    """Past int64 is none: Triton's versions, and the version policy's, are int64."""
    return (
        name.isascii() and name.isdigit() and name == str(int(name)) and 0 < int(name) <= INT64_MAX
    )


def _present(path: Path) -> bool:
    """A file, or a link that may lead to none (whose failure is then reported)."""
    return path.exists() or path.is_symlink()


def config_path(model_dir: Path, config_name: str | None) -> Path:
    """The file a model's config is read from, Triton's choice: ``configs/<name>.pbtxt`` where
    it exists (a dangling link counts, so its failure is reported), else config.pbtxt."""
    if config_name is not None:
        named = model_dir / CONFIG_FOLDER / f"{config_name}.pbtxt"
        if _present(named):
            return named
    return model_dir / CONFIG_FILENAME


class _ModelCheck:
    """Resolves one model directory, collecting every problem rather than stopping at the first."""

    def __init__(
        self,
        root: Path,
        name: str,
        config: ModelConfig | None = None,
        config_name: str | None = None,
        auto_complete: bool = True,
        backend_config: BackendConfig | None = None,
    ) -> None:
        self.root = root
        self.backend_config = backend_config
        self.override = config
        self.config_name = config_name
        self.auto_complete = auto_complete
        self.name = name
        self.dir = root / name
        self.source = f"{name}/{CONFIG_FILENAME}"
        self.problems: list[str] = []
        self.file_problems = 0  # of those, found in a model file
        self.without_gpu: list[ModelVersion] = []  # plans that could not be read here
        self.refused_dirs = False  # a version directory leading outside the repository

    def label(self, path: Path) -> str:
        """A path as the user knows it: relative to the repository root."""
        return path.relative_to(self.root).as_posix()

    def fail(self) -> InvalidModel:
        in_files = len(self.problems) == self.file_problems
        return (InvalidModelFiles if in_files else InvalidModel)(self.name, self.problems)

    def _in_file(self, problems: list[str]) -> None:
        """Problems found in a model file rather than in the config alone."""
        self.problems += problems
        self.file_problems += len(problems)

    def run(self) -> ResolvedModel:
        if not self.dir.is_dir():
            raise NotFound(
                f"failed to load '{self.name}', failed to poll from model repository "
                f"(batchserve: model '{self.name}' is not in the repository)"
            )
        escape = _escape(self.dir, self.root)
        if escape is not None:
            self.problems.append(f"{self.name}: the model directory {escape}")
            raise self.fail()
        config = self._read_config()
        dirs = self._contained(_version_dirs(self.dir))
        if builtin_backend(config) is not None or is_ensemble(config):
            return self._without_file(config, dirs)
        model_format = self._format(config, dirs)
        if model_format is None:
            self.problems += config_problems(config, source=self.source, directory=self.name)
            if not self.auto_complete:  # what the config lacks is wrong whatever runs it
                self.problems += completeness_problems(
                    config, source=self.source, need=AUTO_COMPLETE_OFF
                )
            raise self.fail()
        versions = self._served(config, dirs, model_format)
        signatures = [(v, self._signature(model_format, v)) for v in versions]
        resolved = self._complete(config, model_format, signatures)
        if model_format == IDENTITY:
            self.problems += [f"{self.source}: {p}" for p in identity_problems(resolved)]
        labels, problems = read_labels(resolved.output, self.dir, source=self.source)
        self.problems += problems
        if self.problems:
            raise self.fail()
        tunable = wants_tuning(config)
        return ResolvedModel(
            self.name, resolved, tuple(versions), labels, self.dir, self.source, tunable
        )

    def _without_file(self, config: ModelConfig, dirs: dict[int, Path]) -> ResolvedModel:
        """A model with no file to read: an ensemble, or a decoupled model served by a
        backend in the server."""
        done = ModelConfig()
        done.CopyFrom(config)
        done.name = done.name or self.name
        done.version_policy.CopyFrom(version_policy(done))
        versions = [ModelVersion(n, dirs[n]) for n in self._selected(done, list(dirs))]
        self.problems += config_problems(done, source=self.source, directory=self.name)
        own = structure_problems(done) if is_ensemble(done) else builtin_problems(done)
        self.problems += [f"{self.source}: {problem}" for problem in own]
        labels, problems = read_labels(done.output, self.dir, source=self.source)
        self.problems += problems
        if self.problems:
            raise self.fail()
        return ResolvedModel(self.name, done, tuple(versions), labels, self.dir, self.source)

    def _read_config(self) -> ModelConfig:
        if self.override is not None:
            self.source = f"{self.name}: load parameter 'config'"
            return self.override
        path = config_path(self.dir, self.config_name)
        self.source = self.label(path)
        if not _present(path):
            return ModelConfig()
        escape = _escape(path, self.root)
        if escape is not None:
            self.problems.append(f"{self.source}: {escape}")
            raise self.fail()
        try:
            return parse_pbtxt(read_pbtxt_text(path, source=self.source), source=self.source)
        except ModelConfigError as exc:
            self.problems.append(exc.message)
        raise self.fail()

    def _contained(self, dirs: dict[int, Path]) -> dict[int, Path]:
        """Version directories inside the repository; the others are problems."""
        if not dirs:
            self.problems.append(
                f"{self.name}: no version directory (expected e.g. {self.name}/1/model.onnx)"
            )
        inside: dict[int, Path] = {}
        for number, version_dir in dirs.items():
            escape = _escape(version_dir, self.root)
            if escape is None:
                inside[number] = version_dir
            else:
                self.problems.append(f"{self.label(version_dir)}: version directory {escape}")
                self.refused_dirs = True
        return inside

    def _format(self, config: ModelConfig, dirs: dict[int, Path]) -> ModelFormat | None:
        """The file format: from platform/backend, else the file name, else the files present."""
        try:
            named = format_from_config(config, source=self.source)
        except ModelConfigError as exc:
            self.problems.append(exc.message)
            return None
        filename = config.default_model_filename
        if filename and name_problem(filename) is not None:
            self.problems.append(
                f"{self.source}: default_model_filename '{filename}' is not a plain file name"
            )
            return None
        if named is not None:
            return named
        if filename:
            return self._format_from_filename(filename)
        if self._backend_in_name(config, dirs) == IDENTITY.backend:
            return IDENTITY
        found = self._format_from_files(dirs) if dirs else None
        if found is None and not self.refused_dirs and not self._model_files(dirs):
            self.problems.insert(0, self._no_backend())
        return found

    def _backend_in_name(self, config: ModelConfig, dirs: dict[int, Path]) -> str:
        """Triton's last resort for a config that names no backend, platform or file, when
        no version holds a file it knows: the backend from a model named ``m.<backend>``."""
        if (
            config.platform
            or config.backend
            or any(_present(d / f.default_filename) for d in dirs.values() for f in FORMATS)
        ):
            return ""
        return self.name.partition(".")[2]

    def _model_files(self, dirs: dict[int, Path]) -> list[Path]:
        return [e for d in dirs.values() for e in d.iterdir() if e.name.startswith("model")]

    def _no_backend(self) -> str:
        """Triton's words when nothing tells the backend: its custom-backend rule takes one
        from a name ``model.<backend>``, which batchserve has none of (its are built in)."""
        where = f"{self.name}: "
        _, dot, backend = self.name.partition(".")
        if dot:
            return (
                f"{where}unable to find backend library for backend '{backend}', try specifying "
                f"runtime on the model configuration. (batchserve: {SUPPORTED})"
            )
        return (
            f"{where}Invalid model name: Could not determine backend for model '{self.name}' "
            "with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'."
        )

    def _format_from_filename(self, filename: str) -> ModelFormat | None:
        found = format_from_filename(filename)
        if found is None:
            self.problems.append(
                f"{self.source}: default_model_filename '{filename}' implies an unsupported "
                f"backend; {SUPPORTED}"
            )
        return found

    def _format_from_files(self, dirs: dict[int, Path]) -> ModelFormat | None:
        """A dangling or looping link counts as present, so that its failure is reported."""
        found = {f for d in dirs.values() for f in FORMATS if _present(d / f.default_filename)}
        if len(found) == 1:
            return found.pop()
        if found:
            present = " and ".join(sorted(f.default_filename for f in found))
            both = "both " if len(found) == 2 else ""
            self.problems.append(
                f"{self.name}: {both}{present} are present; set platform in {self.source}"
            )
            return None
        others = sorted(self.label(e) for e in self._model_files(dirs))
        if others:
            self.problems.append(f"{others[0]}: unsupported backend; {SUPPORTED}")
        else:
            self.problems.append(
                f"{self.name}: no model file in any version directory "
                "(expected model.onnx, model.plan or model.pt2)"
            )
        return None

    def _served(
        self, config: ModelConfig, dirs: dict[int, Path], model_format: ModelFormat
    ) -> list[ModelVersion]:
        filename = config.default_model_filename or model_format.default_filename
        served = []
        selected = self._selected(config, list(dirs))
        if dirs and not selected:  # found when the versions are read: Triton's load stage
            self._in_file([
                f"at least one version must be available under the version policy of model "
                f"'{self.name}' (batchserve: {self.source}: none of {self.name}'s version "
                "directories is one it names)"
            ])  # fmt: skip
        for number in selected:
            model_file = dirs[number] / filename
            # the identity backend reads no file: its version directory is enough
            if model_format == IDENTITY or self._usable(model_file):
                served.append(ModelVersion(number, model_file, directory_stamp(dirs[number])))
        return served

    def _selected(self, config: ModelConfig, available: list[int]) -> list[int]:
        """The version numbers the policy picks; policy values themselves are checked elsewhere."""
        policy = version_policy(config)
        choice = policy.WhichOneof("policy_choice")
        if choice == "all":
            return available
        if choice == "latest":
            count = policy.latest.num_versions
            return available[-count:] if count > 0 else []
        wanted = sorted(set(policy.specific.versions))
        for v in wanted:  # as Triton: the versions present are served, the others said
            if v > 0 and v not in available:
                logger.error("version %d is specified for model '%s', but the version "
                             "directory is not present", v, self.name)  # fmt: skip
        return [v for v in wanted if v in available]

    def _usable(self, model_file: Path) -> bool:
        """The file is inside the repository (after symlinks) and present."""
        escape = _escape(model_file, self.root)
        if escape is not None:
            self.problems.append(f"{self.label(model_file)}: {escape}")
            return False
        if not model_file.is_file():
            self._in_file(
                [f"{self.label(model_file.parent)}: version directory has no {model_file.name}"]
            )
            return False
        return True

    def _signature(self, model_format: ModelFormat, version: ModelVersion) -> ModelSignature | None:
        """The file's signature; None when it cannot be read (a problem, or no GPU for a plan)
        or there is no file (the identity backend's config is all it declares)."""
        if model_format == IDENTITY:
            return None
        try:
            if model_format == PT2:
                return _pt2_signature(version.model_file)
            if model_format != ONNX:
                return self._plan_signature(version)
            signature = read_onnx_signature(version.model_file)
        except ModelConfigError as exc:
            self._in_file([exc.message])
            return None
        self._in_file(external_data_problems(version.model_file, self.label(version.model_file)))
        return signature

    def _plan_signature(self, version: ModelVersion) -> ModelSignature | None:
        from batchserve.backends.tensorrt_engine import read_engine_signature

        try:
            return read_engine_signature(version.model_file)
        except DeviceUnavailable:
            self.without_gpu.append(version)
            return None

    def _complete(
        self,
        config: ModelConfig,
        model_format: ModelFormat,
        signatures: list[tuple[ModelVersion, ModelSignature | None]],
    ) -> ModelConfig:
        """Complete from the newest readable version (unless completion is off), then check
        every version against it."""
        newest = next((sig for _, sig in reversed(signatures) if sig is not None), None)
        filled_from = newest if self.auto_complete else None
        done = complete_config(
            config,
            name=self.name,
            model_format=model_format,
            signature=filled_from,
            backend_config=self.backend_config,
        )
        self.problems += config_problems(done, source=self.source, directory=self.name)
        if not self.auto_complete:
            self.problems += completeness_problems(done, source=self.source, need=AUTO_COMPLETE_OFF)
        for version, signature in signatures:
            if signature is not None:
                label = self.label(version.model_file)
                found = model_problems(
                    done, signature, source=self.source, model_file=label,
                    auto_complete=self.auto_complete,
                )  # fmt: skip
                self._in_file(found)
        if self.without_gpu:
            label = self.label(self.without_gpu[-1].model_file)
            if self.auto_complete:  # else its problems are already listed
                self.problems += completeness_problems(
                    done, source=self.source, need=without_gpu(label)
                )
        return done
