"""What every check script shares: count checks, print one FAIL line per failed one, and end
with the CHECKED line that tests/conftest.py's run_checks reads."""


class Checklist:
    def __init__(self, who: str) -> None:
        self.who = who  # "rank 3", or a process's name
        self.fails: list[str] = []
        self.checked = 0

    def __call__(self, ok: bool, msg: str) -> bool:
        self.checked += 1
        if not ok:
            self.fails.append(msg)
            print(f"FAIL {self.who}: {msg}", flush=True)
        return ok

    def done(self, **extra: object) -> None:
        more = "".join(f" {k}={v}" for k, v in extra.items())
        print(f"CHECKED {self.who} cases={self.checked} failures={len(self.fails)}{more}",
              flush=True)
