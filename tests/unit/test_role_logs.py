"""RoleLogs: several roles in one process, each record in the file of the role whose thread
wrote it."""

import logging
import threading

from trinity.runtime.roles import RoleLogs, log_to_file


def test_records_go_to_the_file_of_the_role_the_thread_is_named_after(tmp_path):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    router = RoleLogs(default="explorer")
    root.handlers, root.level = [router], logging.INFO
    try:
        for name in ("trainer", "explorer", "explorer_runner_0"):
            assert log_to_file(str(tmp_path), name) is True  # shared: added to the router

        def say(thread_name: str, text: str) -> None:
            thread = threading.Thread(target=logging.getLogger("t").info, args=(text,))
            thread.name = thread_name
            thread.start()
            thread.join()

        say("trainer", "trainer step")
        say("explorer", "explorer step")
        say("explorer_runner_0:train-1-arith-3", "task ran")  # longest prefix wins
        say("ThreadPoolExecutor-0_0", "engine thread")  # no role's name: the default's
    finally:
        root.handlers, root.level = saved
        router.close()
    log = tmp_path / "log"
    assert "trainer step" in (log / "trainer.log").read_text()
    runner = (log / "explorer_runner_0.log").read_text()
    explorer = (log / "explorer.log").read_text()
    assert "task ran" in runner and "task ran" not in explorer
    assert "explorer step" in explorer and "engine thread" in explorer
    assert "explorer step" not in (log / "trainer.log").read_text()


def test_a_process_of_its_own_logs_everything_to_its_one_file(tmp_path):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        assert log_to_file(str(tmp_path), "trainer") is False
        assert len(root.handlers) == 1 and not isinstance(root.handlers[0], RoleLogs)
    finally:
        root.handlers[0].close()
        root.handlers, root.level = saved
