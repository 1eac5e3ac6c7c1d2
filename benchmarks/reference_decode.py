"""Decode step time of the default model through the reference attention, by rows and page-table
width (S = pages_per_row * page_size), after a 100-token prefill per row. Host packing included.

    python -m benchmarks.reference_decode
"""

import time

import numpy as np

from tests.paged import PagedDriver
from tgix import load_model


def main():
    loaded = load_model()
    for rows, pages_per_row in ((1, 8), (1, 64), (8, 8), (8, 64)):
        driver = PagedDriver(
            loaded.model,
            loaded.config,
            loaded.mesh,
            page_size=16,
            num_pages=1 + rows * pages_per_row,
            pages_per_row=pages_per_row,
        )
        names = [f"r{i}" for i in range(rows)]
        for name in names:
            driver.step({name: list(range(5, 105))}, num_tokens=128, num_rows=rows)
        times = []
        for _ in range(12):
            start = time.perf_counter()
            driver.step({name: [7] for name in names}, num_tokens=rows, num_rows=rows)
            times.append(time.perf_counter() - start)
        median = float(np.median(times[2:]))  # first two include compilation
        print(
            f"rows={rows} S={pages_per_row * 16}: {median * 1e3:.1f} ms/step, "
            f"{rows / median:.1f} tok/s"
        )
        for name in names:
            driver.release(name)


if __name__ == "__main__":
    main()
