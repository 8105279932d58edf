"""`modgate deploy check`: static checks of the Spark compose files and their `.env`, with file and line.

The rules encode the Spark's deploy pitfalls and tuned engine (docs/spark.md). Severity follows one principle:
an *error* means the deploy will not start, or will silently run something other than what is written or
what the gateway relies on; a *warning* means it runs, but departs from the measured tuning or carries
a value the engine will not use as written.

Rules (rule id, severity: what it checks):

- duplicate-key, error: a key given twice in one YAML mapping (compose refuses the file; PyYAML would
  silently keep the later one).
- duplicate-flag, error: a CLI flag given twice in one service's entrypoint + command; the later one
  silently wins. `--x` and `--no-x`, `--a_b` and `--a-b` count as one flag. Both lines are reported.
- unquoted-number, error: an item of a command, entrypoint or healthcheck-test list that YAML reads as a
  number (or a boolean or null): compose's schema wants strings there.
- command-syntax, error: a command string that cannot be split like a shell line (unbalanced quotes).
- interpolation, error: `${VAR:?msg}` / `${VAR?msg}` unset, or a malformed `${...}`: compose refuses to
  start. Warning: a plain `${VAR}` that is unset (compose substitutes an empty string).
- env-file, error: a `.env` line that is not `KEY=VALUE`. Warning: no `.env` beside the compose file, so
  variables were resolved from `.env.example`.
- memory-fraction-mismatch, error: the engine's `--gpu-memory-utilization` differs from
  `PYTORCH_ALLOC_CONF`'s `per_process_memory_fraction` after resolving variables (the engine OOMs at
  start). Warning: one of the two is set without the other.
- speculative-decoding, error: `--speculative-config`, `--speculative-model`, `--num-speculative-tokens`
  or any `--speculative-*` (MTP included): slower on this workload (MTP accepted 1.6 of 4 drafted
  tokens), and vLLM's Mamba cache 'align' mode (hybrid models with prefix caching) refuses it at start.
- prefill-scheduling, warning: `--long-prefill-token-threshold`, `--max-num-partial-prefills`,
  `--max-long-partial-prefills`, `--no-enable-chunked-prefill`: the tuned engine uses none.
- prefill-balancing, warning: any of the six prefill-balancing flags of the Spark's vLLM fork,
  `--prefill-compute-share`, `--prefill-compute-half-life`, `--max-num-prefill-tokens-per-step`,
  `--max-parallel-prefills`, `--prefill-policy`, `--decode-refill-target`. Measured on the Spark, they cut
  its rate from 46.7 requests/min without them to 24.3, 34.7 and 30.7 in three rounds, all below the 45
  keyframes a minute the business needs; the tuned engine sets none. (A warning by the rule above: the
  engine runs them as written.)
- scheduling-policy, error: a gateway service in the same files sets `MODGATE_ENGINE__USE_PRIORITY` true
  (it then sends each request's priority) and its engine has no `--scheduling-policy priority` (vLLM's
  default fcfs rejects every request whose priority is not 0); or a value vLLM does not accept (it takes
  only fcfs and priority), or a use_priority value the gateway cannot read as a boolean. Without
  use_priority the gateway sends no priority, and fcfs (the seed's final configuration) is fine.
- prompt-tokens-details, error: `--enable-prompt-tokens-details` missing: the per-request truth about
  prefix-cache hits, `usage.prompt_tokens_details.cached_tokens`, comes back null and reads as 0.
- mamba-block-size, error: `--mamba-block-size` not a positive multiple of 8 (vLLM aligns Mamba blocks
  to its causal_conv1d kernel). Warnings, where vLLM will not use the value as written: set without
  `--enable-prefix-caching` (one block per sequence); with `--mamba-cache-mode align` (replaced by the
  attention block size); not a multiple of 16, the smallest attention-kernel block alignment (in mode
  'all' vLLM rounds it to a multiple of lcm(value, kernel alignment) large enough for one Mamba state).
- prefix-match-unit, error: `--prefix-match-unit` not a positive integer; not dividing `--block-size`, or,
  with the block left to vLLM (a hybrid model's is computed at start, a multiple of 16), not dividing 16
  (vLLM refuses a unit that does not divide every prefix-cacheable group's block); with
  `--no-enable-prefix-caching` or a `--mamba-cache-mode` other than align (vLLM ignores it). Warnings: a
  hybrid model (by name, or any `--mamba-*` flag) without it (its block is longer than the shared prompt:
  no request hits; `--prefix-match-unit 16` and the gateway's priming fix it); set on a model that does not
  look hybrid (one KV cache group: vLLM refuses any unit but the block).
- max-inflight, error: the gateway's `MODGATE_ENGINE__MAX_INFLIGHT` (default 8) above its engine's
  `--max-num-seqs`: the excess queues inside the engine, outside the gateway's priority queue and
  deadlines.
- queue-backstop, warning: a vLLM engine a gateway calls has no `--max-num-queued-reqs`, or one not above
  the gateway's `MODGATE_ENGINE__MAX_INFLIGHT`; recommended: twice the cap. With Redis away each replica caps
  alone,
  so replicas together may send the engine several times its cap, which vLLM queues without bound; past
  `--max-num-queued-reqs` it answers 503 "engine busy", which the gateway treats as back-pressure (the
  frame waits or moves to another engine; the circuit is untouched).
- llamacpp-slot-context, error: llama.cpp's `-c` divided among its `--parallel` slots (rounded up to 256;
  all of it with `--kv-unified`) below one keyframe's prompt (1,076 tokens at 660 image tokens, scaled to
  the gateway's `MODGATE_SHAPING__IMAGE_TOKEN_BUDGET`) plus its longest output
  (`MODGATE_ENGINE__MAX_COMPLETION_TOKENS_THINKING`, 512).
- llamacpp-slots, error: the gateway's `MODGATE_ENGINE__MAX_INFLIGHT` above llama-server's slots
  (`--parallel`; unset: the server's auto, 4).
- llamacpp-prompt-cache, error: `--no-cache-prompt`, or `--ctx-checkpoints 0` (the Spark's model is hybrid:
  its recurrent state is reused only from a checkpoint). Warning: `--cache-reuse` with `--mmproj` (the
  server turns it off for multimodal models).
- llamacpp-gpu-layers, error: `-ngl N` below `MODEL_LAYERS` (the GGUF's block count, from the env file).
  Warnings: `-ngl` auto (the default) or a number below 999 when `MODEL_LAYERS` is not set.
- llamacpp-server, error: no `--mmproj` (every image refused), `--no-jinja` (thinking cannot be switched),
  no `--metrics` (the gateway's engine figures read nothing).
- compose-config, error: `docker compose config -q` failed (run only where `docker compose` works; it
  needs no engine. Elsewhere the report says "skipped: docker compose not usable").

An engine service is one whose image or entrypoint/command names vLLM, or llama.cpp (`llama.cpp`,
`llama-server`): the llama.cpp rules judge the latter, every other engine rule the former (its settings
read by `deploy.check.llamacpp`); a gateway service is one with a
`MODGATE_*` environment variable or a command that runs `modgate`. Flags are matched as vLLM's parser
reads them: the last occurrence wins, underscores equal dashes.

Modules, in the order the data flows:

- `loader`: compose files as YAML node trees that keep line numbers (`find_compose_files`), `.env` files.
- `interpolation`: compose's `${VAR}` forms, with problems kept for the `interpolation` rule.
- `compose`: the files merged into services (`read_deployment`), and `read_services` below.
- `llamacpp`: llama-server's settings as its parser reads them (aliases, `LLAMA_ARG_*`, defaults).
- `model`: the vocabulary: `Location`, `Finding`, `CheckReport`, `Service`, `Flag`, `EnvEntry`, flag parsing.
- `rules`: every rule, one module per family, registered in `rules.RULES`.
- `compose_config`: `docker compose config -q`; `checker`: `check_deploy`, which runs it all.

For other commands (`modgate deploy predict` reads the engine's flags with it):
`read_services(compose_files, *, env_file=None, environ=None) -> list[ServiceFlags]` reads the compose
files exactly as `check_deploy` does (same merge, `.env` fallback and flag parser) and returns each service's
name, whether it is an engine or a gateway, its flags (`EngineFlag`: name as written, key as matched, value,
negated, location; `ServiceFlags.last(key)` is the one that wins) and its resolved environment. It reports
nothing; unreadable input raises `UnreadableInputError`.
"""

from deploy.check.checker import check_deploy
from deploy.check.compose import read_services
from deploy.check.compose_config import run_compose_config
from deploy.check.loader import COMPOSE_FILE_NAMES, find_compose_files
from deploy.check.model import (
    DEFAULT_MAX_INFLIGHT,
    CheckReport,
    EngineFlag,
    Finding,
    Location,
    ServiceFlags,
    Severity,
    UnreadableInputError,
)
from deploy.check.rules.gateway import USE_PRIORITY_VARIABLE

__all__ = [
    "COMPOSE_FILE_NAMES",
    "DEFAULT_MAX_INFLIGHT",
    "USE_PRIORITY_VARIABLE",
    "CheckReport",
    "EngineFlag",
    "Finding",
    "Location",
    "ServiceFlags",
    "Severity",
    "UnreadableInputError",
    "check_deploy",
    "find_compose_files",
    "read_services",
    "run_compose_config",
]
