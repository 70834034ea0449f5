"""The worker daemon: says hello, claims over HTTP, runs invocations, reports back."""
