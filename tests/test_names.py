"""Names that become paths: one component, validated in the spec and again where paths are built; no write
or delete ever leaves its output root (issue: `serving.ensemble_name = ".."` wiped `--out-repo`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from tests.runtime.family import build_family, write_spec
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.check import load_spec, spec_from_dict
from trtspec.cli import main
from trtspec.errors import BuildError, RepositoryError, SpecError
from trtspec.names import RESERVED_MODEL_NAMES, inside, name_problem
from trtspec.repository.torch_repo import ModelNames, emit_torch_repository
from trtspec.repository.trtllm import relocate_repository, write_files
from trtspec.repository.trtllm.engine import BLS, DRAFT, POST, PRE, TARGET

BAD = ["..", ".", "a/b", "", "../x", "-x", ".hidden", "a\0b", "a b", "x" * 129, "...", "a\\b"]
GOOD = ["a", "ensemble", "ensemble_v2.1", "a..b", "A-1", "x" * 128]


def _spec(**serving):
    return {"schema": 1, "model": {"target": "/t"}, "speculative": {"method": "none"}, "serving": serving}


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_bad_names_are_refused_naming_the_key(bad):
    for data, key in ((_spec(ensemble_name=bad), "serving.ensemble_name"),
                      ({**_spec(), "model": {"target": "/t", "name": bad}}, "model.name")):
        with pytest.raises(SpecError) as info:
            spec_from_dict(data)
        assert info.value.problems[0].startswith(key), info.value.problems


@pytest.mark.parametrize("good", GOOD)
def test_plain_names_are_accepted(good):
    spec = spec_from_dict({**_spec(ensemble_name=good), "model": {"target": "/t", "name": good}})
    assert spec.name == good and spec.serving.ensemble_name == good


@pytest.mark.parametrize("name", [TARGET, PRE, POST, DRAFT, BLS, "trtspec.repo.json"])
def test_ensemble_name_may_not_be_another_model(name):
    assert name in RESERVED_MODEL_NAMES
    with pytest.raises(SpecError, match="serving.ensemble_name"):
        spec_from_dict(_spec(ensemble_name=name))
    assert set(ModelNames().to_dict().values()) - {"ensemble"} <= set(RESERVED_MODEL_NAMES)


@pytest.mark.parametrize("bad", ["..", ".", "a/b", ""], ids=repr)
def test_check_cli_exits_2_naming_the_key(tmp_path, bad):
    path = tmp_path / "s.toml"
    path.write_text(f'schema = 1\n[model]\ntarget = "t"\n[speculative]\nmethod = "none"\n'
                    f'[serving]\nensemble_name = {json.dumps(bad)}\n')
    result = CliRunner().invoke(main, ["check", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert "error: serving.ensemble_name" in result.output and "hint:" in result.output


@given(st.text(max_size=12))
def test_an_accepted_name_is_always_one_child_of_the_root(name):
    root = Path("/srv/repo")
    if name_problem(name) is None:
        assert inside(root, root / name).parent == root and (root / name).name == name
    else:
        with pytest.raises(SpecError):
            spec_from_dict(_spec(ensemble_name=name))


def test_inside_refuses_the_root_its_parent_and_escapes(tmp_path):
    root = tmp_path / "repo"
    (root / "m").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    assert inside(root, root / "m" / "config.pbtxt") == (root / "m" / "config.pbtxt").resolve()
    assert inside(root, root / "link") == root.resolve() / "link"  # the link itself may be replaced
    for bad in (root, root / ".", root / "..", root / "m" / ".." / "..", tmp_path / "x", root / "link" / "f"):
        with pytest.raises(RepositoryError, match="refusing"):
            inside(root, bad)
    with pytest.raises(BuildError):
        inside(root, root / "..", BuildError)


@pytest.mark.parametrize("bad", ["..", ".", "a/b", ""], ids=repr)
def test_model_names_are_checked_where_they_become_paths(bad):
    with pytest.raises(RepositoryError, match="model name"):
        ModelNames(ensemble=bad)
    with pytest.raises(RepositoryError, match="differ"):
        ModelNames(ensemble="preprocessing")


# --------------------------------------------------------------------------------------------
# Nothing outside a deployment's own directory is ever written or deleted
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    return build_family(tmp_path_factory.mktemp("family"))


def _shared_repo(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """An output repository holding another deployment and the tracked README."""
    repo = tmp_path / "model_repository"
    (repo / "other" / "ensemble").mkdir(parents=True)
    (repo / "other" / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\n')
    (repo / "README.md").write_text("# model_repository/\n")
    return repo, _files(repo)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", ["..", "."], ids=repr)
def test_emitter_with_crafted_names_deletes_nothing(family, tmp_path, bad):
    spec = load_spec(write_spec(family, "lookahead"))
    repo, before = _shared_repo(tmp_path)
    names = ModelNames()
    object.__setattr__(names, "ensemble", bad)  # past __post_init__: the emitter's own guard must hold
    with pytest.raises(RepositoryError, match="refusing"):
        emit_torch_repository(spec, repo / "other", tmp_path / "engines" / "other", names=names)
    assert _files(repo) == before


@pytest.mark.parametrize("field,bad", [("ensemble_name", ".."), ("ensemble_name", "."), ("name", "..")])
def test_build_with_an_unvalidated_spec_never_touches_other_outputs(family, tmp_path, field, bad):
    spec = load_spec(write_spec(family, "lookahead"))
    if field == "name":  # model_copy skips validation: what a buggy caller could hand the builder
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"name": bad})})
    else:
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"ensemble_name": bad})})
    repo, before = _shared_repo(tmp_path)
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "README.md").write_text("# engines/\n")
    with pytest.raises((RepositoryError, BuildError)):
        build(spec, BuildOptions(out_engines=tmp_path / "engines", out_repo=repo, progress=False))
    assert _files(repo) == before
    assert _files(tmp_path / "engines") == {"README.md": b"# engines/\n"}


def test_repository_files_and_manifests_cannot_point_outside(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    with pytest.raises(RepositoryError):
        write_files(root, {"m/config.pbtxt": "", "../escape.txt": "x"})
    assert not (tmp_path / "escape.txt").exists() and not (root / "m").exists()  # checked before any write
    (root / "trtspec.repo.json").write_text(json.dumps({"flavour": "trtllm-engine", "models": ["../../etc"]}))
    with pytest.raises(RepositoryError, match="refusing"):
        relocate_repository(root, engines="/e")


def test_bundle_never_replaces_a_directory_that_is_not_a_bundle(tmp_path):
    from trtspec.backends.bundle import bundle

    spec = spec_from_dict({"schema": 1, "model": {"name": "b", "target": str(tmp_path / "t")},
                           "speculative": {"method": "none"}})
    (tmp_path / "model_repository" / "b").mkdir(parents=True)
    (tmp_path / "model_repository" / "b" / "trtspec.repo.json").write_text('{"flavour": "trtllm-engine"}')
    out = tmp_path / "work"
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    with pytest.raises(RepositoryError, match="not empty"):
        bundle(spec, out, repo_root=tmp_path / "model_repository")
    assert (out / "precious.txt").read_text() == "keep"
