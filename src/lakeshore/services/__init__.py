"""Use cases: what the API and CLI ask for, composed from the store and the domain."""
