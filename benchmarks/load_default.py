"""Time loading the default model (weights + tokenizer); run under `/usr/bin/time -v` for RSS.

rm -rf /tmp/tgix-cold  # cold: no converted tokenizer yet
TGIX_CACHE=/tmp/tgix-cold /usr/bin/time -v python -m benchmarks.load_default
TGIX_CACHE=/tmp/tgix-cold /usr/bin/time -v python -m benchmarks.load_default   # warm cache
"""

import json
import time

t0 = time.perf_counter()
import jax  # noqa: E402

from tgix import load_model, load_tokenizer  # noqa: E402

t_import = time.perf_counter()
loaded = load_model()
jax.block_until_ready(jax.tree.leaves(loaded.model))
t_weights = time.perf_counter()
tokenizer = load_tokenizer(loaded.files)
t_tokenizer = time.perf_counter()
print(
    json.dumps(
        {
            "import_s": round(t_import - t0, 2),
            "weights_s": round(t_weights - t_import, 2),
            "tokenizer_s": round(t_tokenizer - t_weights, 2),
            "total_s": round(t_tokenizer - t0, 2),
            "parameters": sum(x.size for x in jax.tree.leaves(loaded.model)),
        }
    )
)
