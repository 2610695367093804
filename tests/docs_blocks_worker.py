"""Runs the guides' Python blocks for docs_blocks_test.py, in a process of its own.

Usage: python docs_blocks_worker.py PLAN.json RESULTS.json

PLAN is a list of pages: {"page": "docs/data.md", "path": absolute path,
"directory": its working directory, "blocks": [{"line", "marker_line",
"given": [...], "code", "then": [...]}]}. Each page's blocks run in order,
in one namespace and in the page's directory, from the same seed; the first
block that fails ends its page (the blocks after it build on it). A block is
compiled with the page as its file name and its own line numbers, so a
traceback names the page and the line of the guide. RESULTS, rewritten after
each block: {page: [{"line", "seconds", "cpu_seconds", "error"}]}.
"""

import json
import os
import sys
import time
import traceback


def _run(source, filename, first_line, namespace):
    code = compile("\n" * (first_line - 1) + source, filename, "exec")
    exec(code, namespace)


def main(plan_path, results_path):
    import keras

    with open(plan_path) as f:
        plan = json.load(f)
    results = {}
    for page in plan:
        os.chdir(page["directory"])
        keras.utils.clear_session()
        keras.utils.set_random_seed(0)
        keras.config.set_dtype_policy("float32")
        namespace = {"__name__": "__main__"}
        results[page["page"]] = done = []
        failed = False
        for block in page["blocks"]:
            start, cpu = time.perf_counter(), time.process_time()
            error = "not run: a block before it failed" if failed else None
            if not failed:
                print(f"--- {page['page']}:{block['line']}", flush=True)
                try:
                    for given in block["given"]:
                        _run(given, f"{page['page']} (marker, given:)", block["marker_line"],
                             namespace)
                    _run(block["code"], page["path"], block["line"] + 1, namespace)
                    for check in block["then"]:
                        _run(check, f"{page['page']} (marker, then:)", block["marker_line"],
                             namespace)
                except BaseException:  # noqa: BLE001 — reported with its traceback
                    error = traceback.format_exc()
                    failed = True
            done.append({"line": block["line"], "seconds": time.perf_counter() - start,
                         "cpu_seconds": time.process_time() - cpu, "error": error})
            with open(results_path, "w") as f:
                json.dump(results, f)
            sys.stdout.flush()


if __name__ == "__main__":
    main(*sys.argv[1:])
