"""A cluster view for experiment tests that never talk to a cluster: no nodes, nothing to watch,
always reachable, and whatever ``held`` says the job still holds."""


class QuietView:
    dashboard_url = "http://198.18.9.1:1"

    def __init__(self, held=()):
        self.held = list(held)

    def table(self):
        return []

    def watch(self, timeline, on_joined):
        pass

    def stop_watching(self):
        pass

    def unreachable(self, timeout=5.0):
        return None

    def held_by_job(self, job):
        return list(self.held)
