"""``lakeshore.yaml``: parsing keeps lines, validation names file, line and field; and the
pure plan that ``lakeshore apply`` computes from a file and the server's state."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from lakeshore.cli.apply_file import ApplyFile, FileInvalid, load, parse_field
from lakeshore.cli.apply_plan import Fleet, ServerState, field_changes, make_plan

ROOT = Path(__file__).resolve().parents[2]


def parse(text: str, label: str = "lakeshore.yaml") -> ApplyFile:
    return load(textwrap.dedent(text).lstrip("\n"), label)


def problems(text: str) -> list[str]:
    with pytest.raises(FileInvalid) as caught:
        parse(text)
    return caught.value.messages()


def only_problem(text: str) -> str:
    found = problems(text)
    assert len(found) == 1, found
    return found[0]


# --- the example ----------------------------------------------------------------------


def test_the_example_file_parses_with_every_kind_it_shows() -> None:
    example = load((ROOT / "lakeshore.yaml").read_text(), "lakeshore.yaml")
    assert [(p.name, p.kind) for p in example.providers] == [("sandbox", "fake")]
    kinds = {q.name: q.elasticity_kind for q in example.queues}
    assert kinds == {
        "nightly-batch": "fixed",
        "burst": "fully_elastic",
        "embed-small": "pool_with_threshold",
        "embed-large": "pool_with_threshold",
    }
    pools = {q.spec.elasticity.pool for q in example.queues if q.spec.elasticity}
    assert "embed" in pools
    assert [(d.queue, d.count) for d in example.daemons] == [("nightly-batch", 2)]


def test_provider_config_is_normalized_as_the_server_stores_it() -> None:
    parsed = parse(
        """
        providers:
          - name: fk
            kind: fake
            config: {launch_ttl_s: 30}
        """
    )
    assert parsed.providers[0].config == {"launch_ttl_s": 30.0, "hang_s": 0.0}


# --- line and field in every message ---------------------------------------------------


def test_a_hyphenated_elasticity_kind_is_refused_with_the_underscored_spelling() -> None:
    message = only_problem(
        """
        queues:
          - name: cpu
          - name: burst
            elasticity:
              kind: fully-elastic
              max: 4
        """
    )
    assert message == (
        'lakeshore.yaml:5: queues[1].elasticity.kind: "fully-elastic" is the CLI spelling; '
        'the API and lakeshore.yaml take the underscored form "fully_elastic"'
    )


@pytest.mark.parametrize("kind", ["pool-with-threshold", "max-count"])
def test_every_hyphenated_kind_is_refused(kind: str) -> None:
    message = only_problem(f"queues:\n  - name: q\n    elasticity: {{kind: {kind}}}\n")
    assert message.startswith("lakeshore.yaml:3: queues[0].elasticity.kind: ")
    assert kind.replace("-", "_") in message


def test_an_unknown_queue_field_names_its_own_line() -> None:
    message = only_problem(
        """
        queues:
          - name: gpu
            kind: fifo
            provider_ref: sandbox
        """
    )
    assert message == "lakeshore.yaml:4: queues[0].provider_ref: unknown field"


def test_a_missing_field_names_the_item_it_is_missing_from() -> None:
    message = only_problem(
        """
        queues:
          - name: a
          - kind: fifo
        """
    )
    assert message == "lakeshore.yaml:3: queues[1].name: this field is required"


def test_a_range_rule_names_the_nested_field() -> None:
    message = only_problem(
        """
        queues:
          - name: q
            elasticity:
              kind: max_count
              min: 5
              max: 2
        """
    )
    assert message.startswith("lakeshore.yaml:6: queues[0].elasticity.max: ")
    assert "must be at least min (5)" in message


def test_a_server_owned_field_is_refused() -> None:
    message = only_problem("queues:\n  - name: q\n    state: paused\n")
    assert message.startswith("lakeshore.yaml:3: queues[0].state: state is set by the server")


@pytest.mark.parametrize(
    ("entry", "where", "says"),
    [
        ("{queue: q, count: -1}", "daemons[0].count", "greater than or equal to 0"),
        ("{queue: q, count: two}", "daemons[0].count", "valid integer"),
        ("{queue: q, count: 1.5}", "daemons[0].count", "valid integer"),
        ("{queue: q, count: true}", "daemons[0].count", "valid integer"),
        ("{queue: q}", "daemons[0].count", "this field is required"),
        ("{queue: q, count: 1, size: 2}", "daemons[0].size", "unknown field"),
        ("{queue: Q!, count: 1}", "daemons[0].queue", "not a valid name"),
    ],
)
def test_a_bad_compose_entry_names_line_and_field(entry: str, where: str, says: str) -> None:
    message = only_problem(f"queues:\n  - name: q\ndaemons:\n  - {entry}\n")
    assert message.startswith(f"lakeshore.yaml:4: {where}: "), message
    assert says in message


def test_a_bad_provider_kind_and_config_name_line_and_field() -> None:
    found = problems(
        """
        providers:
          - name: one
            kind: k8s
          - name: two
            kind: fake
            config:
              launch_ttl_s: -3
          - name: three
            kind: fake
            config:
              colour: blue
        """
    )
    assert found[0].startswith('lakeshore.yaml:3: providers[0].kind: unknown provider kind "k8s"')
    assert found[1].startswith("lakeshore.yaml:7: providers[1].config.launch_ttl_s: ")
    assert found[2] == "lakeshore.yaml:11: providers[2].config.colour: unknown field"


def test_every_problem_is_reported_in_line_order() -> None:
    found = problems(
        """
        extra: 1
        queues:
          - name: a
            elasticity: {kind: fully-elastic}
          - name: b
            kind: lifo
        daemons:
          - {queue: a, count: -2}
        """
    )
    assert [message.split(":")[1] for message in found] == ["1", "4", "6", "8"]
    assert found[0] == (
        "lakeshore.yaml:1: extra: unknown key; expected one of namespace, providers, "
        "queues, daemons, schedules"
    )


def test_the_label_is_the_file_name_given() -> None:
    with pytest.raises(FileInvalid) as caught:
        load("queues: 3\n", "deploy/prod.yaml")
    assert caught.value.messages() == [
        "deploy/prod.yaml:1: queues: queues is a list (items start with '- ')"
    ]


# --- duplicates ------------------------------------------------------------------------


def test_duplicate_names_are_reported_with_both_lines() -> None:
    found = problems(
        """
        providers:
          - {name: fk, kind: fake}
          - {name: fk, kind: fake}
        queues:
          - name: gpu
          - name: cpu
          - name: gpu
        daemons:
          - {queue: cpu, count: 1}
          - {queue: cpu, count: 2}
        """
    )
    assert found == [
        'lakeshore.yaml:3: providers[1].name: provider "fk" is declared twice (lines 2 and 3)',
        'lakeshore.yaml:7: queues[2].name: queue "gpu" is declared twice (lines 5 and 7)',
        'lakeshore.yaml:10: daemons[1].queue: compose entry for queue "cpu" is declared '
        "twice (lines 9 and 10)",
    ]


def test_a_key_written_twice_in_one_mapping_is_refused() -> None:
    message = only_problem(
        """
        queues:
          - name: gpu
            kind: fifo
            kind: priority
        """
    )
    assert message == "lakeshore.yaml:4: queues[0].kind: duplicate key 'kind' (lines 3 and 4)"


# --- compose rules the file alone decides ----------------------------------------------


def test_a_compose_entry_for_a_policy_queue_is_refused() -> None:
    message = only_problem(
        """
        queues:
          - name: burst
            elasticity: {kind: fully_elastic, max: 4}
        daemons:
          - queue: burst
            count: 2
        """
    )
    assert message.startswith('lakeshore.yaml:5: daemons[0].queue: queue "burst" is fully_elastic')
    assert "line 2" in message
    assert "fixed queues only" in message


def test_a_compose_entry_for_a_fixed_or_unset_queue_is_accepted() -> None:
    parsed = parse(
        """
        queues:
          - name: a
            elasticity: {kind: fixed}
          - name: b
            elasticity: null
          - name: c
        daemons:
          - {queue: a, count: 1}
          - {queue: b, count: 0}
          - {queue: c, count: 3}
        """
    )
    assert [q.elasticity_kind for q in parsed.queues] == ["fixed", "fixed", None]


# --- YAML itself -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "lakeshore.yaml:1: the file is empty"),
        ("# only a comment\n", "lakeshore.yaml:1: the file is empty"),
        ("- a\n- b\n", "lakeshore.yaml:1: the file is a mapping"),
        ("queues:\n  - name: a\n   kind: fifo\n", "lakeshore.yaml:3: not valid YAML"),
        ("queues: [\n", "lakeshore.yaml:2: not valid YAML"),
        ("a: 1\n---\nb: 2\n", "lakeshore.yaml:2: not valid YAML"),
        ("queues:\n  - name: a\n    description: 2024-01-01\n", "lakeshore.yaml:3: queues[0]"),
        ("providers:\n  - {name: f, kind: fake, config: {hang_s: .inf}}\n", "lakeshore.yaml:2"),
        ("queues:\n  - name: !!python/name:os.system\n", "lakeshore.yaml:2: not valid YAML"),
        ("queues:\n  - {? [a]: 1}\n", "lakeshore.yaml:2: queues[0]: a key must be text"),
        ("queues:\n  - {1: a}\n", "lakeshore.yaml:2: queues[0]: key 1 must be text"),
        ("namespace: Prod!\n", "lakeshore.yaml:1: namespace: 'Prod!' is not a namespace"),
    ],
)
def test_yaml_problems_name_the_line(text: str, expected: str) -> None:
    message = only_problem(text)
    assert message.startswith(expected), message


def test_dates_are_refused_with_a_hint_to_quote_them() -> None:
    message = only_problem("queues:\n  - name: a\n    description: 2024-01-01\n")
    assert message == (
        "lakeshore.yaml:3: queues[0].description: a YAML date value is not JSON; "
        "quote it to make it text"
    )


def test_anchors_aliases_and_merge_keys_work() -> None:
    parsed = parse(
        """
        queues:
          - &base
            name: small
            providerRef: fk
            elasticity: &pool {kind: pool_with_threshold, pool: p, max: 4}
          - <<: *base
            name: large
            elasticity: *pool
        """
    )
    small, large = parsed.queues
    assert large.given["providerRef"] == "fk"
    assert small.spec.elasticity == large.spec.elasticity


def test_a_merged_key_may_be_overridden_but_an_own_key_not_repeated() -> None:
    message = only_problem(
        """
        queues:
          - &base {name: a, kind: fifo}
          - <<: *base
            name: b
            name: c
        """
    )
    assert message == "lakeshore.yaml:5: queues[1].name: duplicate key 'name' (lines 4 and 5)"


def test_the_namespace_is_read() -> None:
    assert parse("namespace: staging\nqueues: []\n").namespace == "staging"
    assert parse("queues: []\n").namespace is None


def test_parse_field_reads_paths_back() -> None:
    assert parse_field("elasticity.match.tags[0]") == ("elasticity", "match", "tags", 0)
    assert parse_field("daemonTemplate.cloudTags") == ("daemonTemplate", "cloudTags")


# --- the plan (pure) -------------------------------------------------------------------


def server_queue(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "kind": "fifo", "state": "active", **fields}


def daemon(worker_id: str, running: int = 0, created: str = "2026-01-01T00:00:00") -> Any:
    return {"id": worker_id, "queues": ["batch"], "running": running, "createdAt": created}


FILE = """
providers:
  - {name: fk, kind: fake, config: {launch_ttl_s: 60}}
queues:
  - name: batch
    providerRef: fk
    elasticity: {kind: fixed}
  - name: burst
    providerRef: fk
    elasticity: {kind: fully_elastic, max: 8}
daemons:
  - {queue: batch, count: 2}
"""


def matching_state(fleet: Fleet) -> ServerState:
    return ServerState(
        providers={"fk": {"name": "fk", "kind": "fake", "config": {"launch_ttl_s": 60.0,
                                                                    "hang_s": 0.0}}},
        queues={
            "batch": server_queue("batch", providerRef="fk", elasticity={"kind": "fixed"}),
            "burst": server_queue(
                "burst", providerRef="fk", elasticity={"kind": "fully_elastic", "max": 8}
            ),
        },
        fleets={"batch": fleet},
    )  # fmt: skip


def test_an_empty_namespace_plans_every_create_and_the_launches() -> None:
    plan = make_plan(parse(FILE), ServerState({}, {}, {}), "default")
    assert not plan.problems
    assert [step.text for step in plan.steps] == [
        "+ provider fk (fake)",
        "+ queue batch (fifo, fixed)",
        "+ queue burst (fifo, fully_elastic)",
        "+ 2 daemons for queue batch (0 → 2, through fk)",
    ]


def test_a_matching_namespace_plans_nothing() -> None:
    plan = make_plan(parse(FILE), matching_state(Fleet((daemon("w1"),), 1)), "default")
    assert not plan.problems
    assert {step.action for step in plan.steps} == {"unchanged"}
    assert all(not step.calls for step in plan.steps)


def test_only_the_fields_that_differ_are_patched() -> None:
    state = matching_state(Fleet((), 2))
    state.queues["burst"]["description"] = "left alone: the file does not set it"
    changed = FILE.replace("max: 8", "max: 12")
    plan = make_plan(parse(changed), state, "default")
    updates = [step for step in plan.steps if step.action == "update"]
    assert [step.text for step in updates] == ["~ queue burst: elasticity.max 8 → 12"]
    (call,) = updates[0].calls
    assert (call.method, call.segments) == ("PATCH", ("queues", "burst"))
    assert call.body == {"elasticity": {"kind": "fully_elastic", "max": 12}}


def test_a_changed_provider_named_by_a_queue_is_a_problem_not_a_replace() -> None:
    plan = make_plan(parse(FILE.replace("60", "90")), matching_state(Fleet((), 2)), "default")
    (problem,) = plan.problems
    assert problem.line == 2
    assert problem.field == "providers[0].config"
    assert '"batch", "burst" name it' in problem.message


def test_a_changed_provider_no_queue_names_is_replaced() -> None:
    state = matching_state(Fleet((), 2))
    for queue in state.queues.values():
        queue["providerRef"] = "other"
    plan = make_plan(parse(FILE.replace("60", "90")), state, "default")
    (replace,) = [step for step in plan.steps if step.type == "provider"]
    assert replace.action == "replace"
    assert [call.method for call in replace.calls] == ["DELETE", "POST"]
    assert "config.launch_ttl_s 60.0 → 90.0" in replace.text


def test_extras_retire_idle_daemons_newest_first_and_busy_ones_are_kept() -> None:
    fleet = Fleet(
        (
            daemon("old", created="2026-01-01T00:00:00"),
            daemon("busy", running=1, created="2026-01-03T00:00:00"),
            daemon("new", created="2026-01-02T00:00:00"),
        ),
        0,
    )
    plan = make_plan(parse(FILE.replace("count: 2", "count: 0")), matching_state(fleet), "ns")
    compose = [step for step in plan.steps if step.type in ("daemon", "daemons")]
    assert [(step.action, step.name) for step in compose] == [
        ("retire", "new"),
        ("retire", "old"),
        ("keep", "batch"),
    ]
    assert "1 running invocations" in compose[-1].text


def test_a_compose_entry_for_a_queue_nowhere_or_scaled_on_the_server_is_a_problem() -> None:
    text = "daemons:\n  - {queue: ghost, count: 1}\n  - {queue: burst, count: 1}\n"
    state = matching_state(Fleet((), 0))
    plan = make_plan(parse(text), state, "prod")
    assert [(p.line, p.field) for p in plan.problems] == [
        (2, "daemons[0].queue"),
        (3, "daemons[1].queue"),
    ]
    assert 'neither declared in this file nor on the server (namespace "prod")' in (
        plan.problems[0].message
    )
    assert "is fully_elastic (on the server)" in plan.problems[1].message


def test_field_changes_recurse_into_objects_and_mark_unset() -> None:
    old = {"kind": "fully_elastic", "max": 4, "pool": "gpu"}
    new = {"kind": "fully_elastic", "max": 8}
    assert [(path, str(a), str(b)) for path, a, b in field_changes(old, new, "elasticity")] == [
        ("elasticity.max", "4", "8"),
        ("elasticity.pool", "gpu", "(unset)"),
    ]
    assert field_changes(1, True, "x") != []
    assert field_changes(None, {}, "admission") == []
