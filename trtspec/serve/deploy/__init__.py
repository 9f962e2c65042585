"""Deploy a built torch-runtime deployment onto an already running Triton server (explicit
model-control mode) without an outage: load the new version beside the serving one, smoke-test it,
switch, and roll back on failure.

    deploy_spec(spec, "localhost:8000", "/srv/model_repository", grpc_url="localhost:8001")

1. Preflight: the build (`model_repository/<name>/` + `engines/<name>/` with a readable lock) exists,
   the server at `url` (HTTP) is live and ready, the gRPC endpoint for the smoke test is known; then
   `DIR.trtspec/deploy.lock` is taken beside the server repository DIR (one deploy per repository at a
   time: the candidate names below are fixed, so a crashed deploy's leftovers are found and cleared by the
   next one), and what an older trtspec left inside DIR moves out (migrate.py). Nothing but models lives
   in DIR: Triton takes every directory there for a model (layout.py).
2. Stage: the build's model dirs and its engine dir are copied into `DIR.trtspec/stage/<rev>/` (on the
   server repository's mount). Every model's `engine_dir` parameter becomes
   `../DIR.trtspec/engines/<name>` (relative to the repository root, so it resolves wherever DIR's parent
   is mounted) and every config gets the parameter `trtspec_revision = <rev>`, so Triton sees a changed
   model.
3. Candidate (the deployment's ensemble is serving): the four models are staged once more under the
   candidate names `<model>__trtspec_next` (the candidate ensemble's steps are the candidate models,
   which read the engine from the stage dir), loaded beside the serving version, smoke-tested, and
   unloaded again, so that no more than two copies of the generation model are ever loaded.
4. Switch: the staged dirs are renamed in under the serving names and to `DIR.trtspec/engines/<name>`
   (what was there moves to `DIR.trtspec/backups/<rev>/`, kept) and the generation model, pre/postprocessing and the
   ensemble are loaded again. Triton 2.51 loads an already loaded model whose files and config changed
   beside the old instance and switches when the new one is ready; requests in flight on the old one
   finish there (measured under traffic: no failed request). A failed reload keeps the old instance
   serving, yet `load_model(ensemble)` reports success even when a step failed to reload, so each step
   is loaded on its own, then the served configs must all carry the new revision and one greedy
   request through the serving ensemble must return the candidate's smoke text.
5. Failure (unless `rollback=False`): before the switch only candidate names were touched: they are
   unloaded and removed; the serving version never changed. During the switch: the backup moves back
   and the models are loaded again (again beside the running ones). A DeployError says what failed and
   what was rolled back.

When nothing of the deployment serves (a first deploy), or with `candidate=False` (for a server
without memory for a second copy), the models are replaced in place instead: swap the files, unload
the deployment, load its ensemble, smoke-test the serving names, and on failure restore the backup
and reload what was ready before. Requests fail while the deployment is unloaded.

Triton 2.51 cannot load an ensemble whose steps were sent with `load_model(files=...)`, so the files
go through the server's repository directory, never over the API.

The package, one job per module: `layout` (names, places, the lock), `migrate` (an older trtspec's state out
of DIR; `tidy`), `preflight`, `staging` (stage dir and file swaps), `loading` (model control), `smoke`,
`orchestrate` (deploy_spec), `records`, `rollback`.
"""

from trtspec.serve.control import REVISION_PARAM
from trtspec.serve.deploy.layout import (
                                         CANDIDATE_SUFFIX,
                                         ENGINES_SUBDIR,
                                         KEEP_BACKUPS,
                                         LEGACY_BACKUP_PREFIX,
                                         LEGACY_LOCK_FILE,
                                         LEGACY_STAGE_PREFIX,
                                         STATE_SUFFIX,
                                         Layout,
                                         candidate_name,
                                         server_layout,
)
from trtspec.serve.deploy.migrate import migrate, migration_note, tidy
from trtspec.serve.deploy.orchestrate import DeployResult, deploy_spec
from trtspec.serve.deploy.preflight import resolve_grpc_url
from trtspec.serve.deploy.records import RECORDS_DIR, prune_backups, read_records, records_dir, write_record
from trtspec.serve.deploy.rollback import RollbackResult, rollback_spec
from trtspec.serve.deploy.smoke import DEFAULT_SMOKE_PROMPT, SmokeResult, smoke_test

__all__ = [
    "CANDIDATE_SUFFIX", "DEFAULT_SMOKE_PROMPT", "ENGINES_SUBDIR", "KEEP_BACKUPS", "LEGACY_BACKUP_PREFIX",
    "LEGACY_LOCK_FILE", "LEGACY_STAGE_PREFIX", "RECORDS_DIR", "REVISION_PARAM", "STATE_SUFFIX", "DeployResult",
    "Layout", "RollbackResult", "SmokeResult", "candidate_name", "deploy_spec", "migrate", "migration_note",
    "prune_backups", "read_records", "records_dir", "resolve_grpc_url", "rollback_spec", "server_layout",
    "smoke_test", "tidy", "write_record",
]
