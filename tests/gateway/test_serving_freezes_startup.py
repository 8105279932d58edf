"""A serving process freezes what its startup built out of the garbage collector's sight (cli/serving.py):
full collections then leave the app's long-lived objects alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SERVE_AND_REPORT = textwrap.dedent("""
    import asyncio, gc, socket
    import uvicorn
    from litestar import Litestar, get
    from cli.serving import DrainingServer
    from gateway.drain import Drain

    @get("/")
    async def root() -> str:
        return "ok"

    async def main() -> None:
        config = uvicorn.Config(Litestar([root]), port=0, log_level="warning", lifespan="on")
        server = DrainingServer(config, Drain(0))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        before = gc.get_freeze_count()
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        print(before, gc.get_freeze_count() > 1000)
        server.should_exit = True
        await serving

    asyncio.run(main())
""")


def test_startup_leaves_the_apps_objects_frozen() -> None:
    done = subprocess.run([sys.executable, "-c", SERVE_AND_REPORT], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == ["0", "True"], done.stderr
