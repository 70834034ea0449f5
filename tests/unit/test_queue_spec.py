"""Every validation rule of the queue record, as a table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from lakeshore.domain.kinds import normalize_elasticity_kind
from lakeshore.domain.queue import Queue, QueueSpec, merge_patch, parse_spec
from lakeshore.errors import InvalidInput


def spec(**fields: Any) -> dict[str, Any]:
    return {"name": "gpu", **fields}


ACCEPTED = [
    pytest.param(spec(), id="name only"),
    pytest.param(spec(name="a"), id="one-char name"),
    pytest.param(spec(name="a" * 63), id="63-char name"),
    pytest.param(spec(name="0.train_gpu-2"), id="digits dots underscores hyphens"),
    pytest.param(spec(kind="priority", kindParams={"priority_field": "urgency"}), id="priority"),
    pytest.param(spec(kind="boltzmann", kindParams={"temperature": 0.5}), id="boltzmann"),
    pytest.param(spec(kind="filo"), id="filo"),
    pytest.param(
        spec(
            admission={
                "max_depth": 10,
                "on_full": "block",
                "rate_limit": 2.5,
                "deadline_cutoff_s": 60,
            }
        ),
        id="admission",
    ),
    pytest.param(spec(reservedSlots=0), id="reserved slots zero"),
    pytest.param(
        spec(authPolicy={"submit": ["ci"], "read": [], "claim": ["tok_0123"]}), id="auth policy"
    ),
    pytest.param(spec(providerRef="aws-east"), id="provider"),
    pytest.param(spec(elasticity={"kind": "fixed"}), id="fixed"),
    pytest.param(
        spec(elasticity={"kind": "fully_elastic", "min": 0, "max": 4}), id="fully elastic"
    ),
    pytest.param(spec(elasticity={"kind": "max_count", "max": 4}), id="max count"),
    pytest.param(spec(elasticity={"kind": "max_count"}), id="max count without max"),
    pytest.param(
        spec(elasticity={"kind": "fully_elastic", "min": 3, "max": 3}), id="min equals max"
    ),
    pytest.param(
        spec(elasticity={"kind": "pool_with_threshold", "threshold": 1, "threshold_low": 0.99}),
        id="threshold at 1",
    ),
    pytest.param(
        spec(elasticity={"kind": "pool_with_threshold", "threshold": 0.31}),
        id="low default under high",
    ),
    pytest.param(
        spec(
            elasticity={
                "kind": "fully_elastic",
                "pool": "gpu-fleet",
                "match": {"tags": ["gpu:h100"], "runners": ["docker"]},
                "steal_delay_s": 5,
            }
        ),
        id="pool match steal delay",
    ),
    pytest.param(
        spec(
            daemonTemplate={
                "instance_type": "p5.48xlarge",
                "image_id": "ami-123",
                "runner": "process",
                "runners": ["process", "docker"],
                "capacity": 4,
                "cloudTags": {"team": "ml"},
                "bootstrap_script": "pip install lakeshore",
                "setup_scripts": ["nvidia-smi"],
                "provider": "aws-east",
            }
        ),
        id="daemon template",
    ),
    pytest.param(spec(customScalerUdf="my_scalers.gpu:decide"), id="custom scaler path"),
    pytest.param(spec(serverNodeId="node-a"), id="server node"),
    pytest.param(spec(description="x" * 1024), id="long description"),
]


@pytest.mark.parametrize("body", ACCEPTED)
def test_valid_queue_specs_are_accepted(body: dict[str, Any]) -> None:
    parsed = parse_spec(body)
    assert parsed.name == body["name"]
    # what the API shows is what was written, plus the fifo default
    assert parsed.to_json() == {"kind": "fifo", **body}


REFUSED = [
    # (body, field, words the message must contain)
    (spec(name=""), "name", "not a valid name"),
    (spec(name="a" * 64), "name", "not a valid name"),
    (spec(name="GPU"), "name", "lowercase"),
    (spec(name="-gpu"), "name", "starting with a letter or a digit"),
    (spec(name="gpu/train"), "name", "not a valid name"),
    (spec(name="gpu train"), "name", "not a valid name"),
    (spec(name=7), "name", "valid string"),
    ({}, "name", "required"),
    (spec(kind="lifo"), "kind", "'fifo'"),
    (spec(kindParams={"temperature": 0}), "kindParams.temperature", "greater than 0"),
    (spec(kindParams={"priority_field": ""}), "kindParams.priority_field", "at least 1"),
    (spec(kindParams={"other": 1}), "kindParams.other", "unknown field"),
    (spec(admission={"max_depth": 0}), "admission.max_depth", "greater than or equal to 1"),
    (spec(admission={"max_depth": 2.5}), "admission.max_depth", "integer"),
    (spec(admission={"on_full": "drop"}), "admission.on_full", "'reject' or 'block'"),
    (spec(admission={"rate_limit": 0}), "admission.rate_limit", "greater than 0"),
    (spec(admission={"deadline_cutoff_s": -1}), "admission.deadline_cutoff_s", "greater than 0"),
    (spec(reservedSlots=-1), "reservedSlots", "greater than or equal to 0"),
    (spec(reservedSlots="2"), "reservedSlots", "integer"),
    (spec(providerRef="AWS"), "providerRef", "not a valid name"),
    (spec(elasticity={}), "elasticity.kind", "required"),
    (spec(elasticity={"kind": "fully-elastic"}), "elasticity.kind", '"fully_elastic"'),
    (spec(elasticity={"kind": "pool-with-threshold"}), "elasticity.kind", '"pool_with_threshold"'),
    (spec(elasticity={"kind": "max-count"}), "elasticity.kind", '"max_count"'),
    (spec(elasticity={"kind": "elastic"}), "elasticity.kind", "expected one of fixed"),
    (spec(elasticity={"kind": "fixed", "min": -1}), "elasticity.min", "greater than or equal to 0"),
    (spec(elasticity={"kind": "fixed", "min": 1.0}), "elasticity.min", "integer"),
    (spec(elasticity={"kind": "fixed", "max": True}), "elasticity.max", "integer"),
    (spec(elasticity={"kind": "fixed", "max": "4"}), "elasticity.max", "integer"),
    (spec(elasticity={"kind": "fixed", "min": 5, "max": 4}), "elasticity.max", "at least min (5)"),
    (spec(elasticity={"kind": "fixed", "threshold": 0}), "elasticity.threshold", "greater than 0"),
    (
        spec(elasticity={"kind": "fixed", "threshold": 1.5}),
        "elasticity.threshold",
        "less than or equal to 1",
    ),
    (
        spec(elasticity={"kind": "fixed", "threshold_low": 0}),
        "elasticity.threshold_low",
        "greater than 0",
    ),
    (
        spec(elasticity={"kind": "fixed", "threshold": 0.5, "threshold_low": 0.5}),
        "elasticity.threshold_low",
        "below threshold (0.5)",
    ),
    (
        spec(elasticity={"kind": "pool_with_threshold", "threshold": 0.2}),
        "elasticity.threshold_low",
        "0.3, the default",
    ),
    (
        spec(elasticity={"kind": "pool_with_threshold", "threshold_low": 0.9}),
        "elasticity.threshold_low",
        "0.8, the default",
    ),
    (spec(elasticity={"kind": "fixed", "pool": "Pool!"}), "elasticity.pool", "not a valid name"),
    (spec(elasticity={"kind": "fixed", "match": {"tags": "gpu"}}), "elasticity.match.tags", "list"),
    (
        spec(elasticity={"kind": "fixed", "match": {"zones": []}}),
        "elasticity.match.zones",
        "unknown field",
    ),
    (
        spec(elasticity={"kind": "fixed", "steal_delay_s": -1}),
        "elasticity.steal_delay_s",
        "greater than or equal to 0",
    ),
    (spec(daemonTemplate={"capacity": 0}), "daemonTemplate.capacity", "greater than or equal to 1"),
    (spec(daemonTemplate={"cloud_tags": {}}), "daemonTemplate.cloud_tags", "unknown field"),
    (spec(daemonTemplate={"cloudTags": {"a": 1}}), "daemonTemplate.cloudTags.a", "valid string"),
    (spec(daemonTemplate={"setup_scripts": "echo hi"}), "daemonTemplate.setup_scripts", "list"),
    (spec(daemonTemplate={"provider": "Bad Name"}), "daemonTemplate.provider", "not a valid name"),
    (spec(customScalerUdf="os.system"), "customScalerUdf", "package.module:function"),
    (spec(customScalerUdf="x:y; rm -rf /"), "customScalerUdf", "package.module:function"),
    (spec(serverNodeId=""), "serverNodeId", "at least 1"),
    (spec(description="x" * 1025), "description", "at most 1024"),
    (spec(kind_params={}), "kind_params", "unknown field"),
    (spec(state="paused"), "state", "drain, pause, resume"),
    (spec(id="q_1"), "id", "set by the server"),
    (spec(createdAt="2026-01-01"), "createdAt", "set by the server"),
    (spec(authPolicy={"x": float("nan")}), "authPolicy.x", "NaN"),
    (spec(admission={"rate_limit": float("inf")}), "admission.rate_limit", "finite"),
    (spec(elasticity={"kind": "fixed", "future": [float("nan")]}), "elasticity.future[0]", "NaN"),
]


@pytest.mark.parametrize(
    ("body", "field", "words"), REFUSED, ids=[f"{r[1]}:{r[2]}" for r in REFUSED]
)
def test_invalid_queue_specs_name_the_field(body: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(body)
    assert caught.value.field == field
    assert words in caught.value.message


@pytest.mark.parametrize("body", [None, [], "gpu", 3])
def test_a_queue_must_be_a_json_object(body: Any) -> None:
    with pytest.raises(InvalidInput, match="JSON object"):
        parse_spec(body)


def test_unknown_keys_inside_elasticity_are_kept() -> None:
    parsed = parse_spec(
        spec(elasticity={"kind": "fully_elastic", "burst_factor": 2, "x": {"y": [1]}})
    )
    assert parsed.to_json()["elasticity"] == {
        "kind": "fully_elastic",
        "burst_factor": 2,
        "x": {"y": [1]},
    }


def test_threshold_defaults_are_the_spec_values() -> None:
    elasticity = parse_spec(spec(elasticity={"kind": "pool_with_threshold"})).elasticity
    assert elasticity is not None
    assert (elasticity.high, elasticity.low) == (0.8, 0.3)


def test_patch_replaces_a_nested_object_whole() -> None:
    base = parse_spec(spec(elasticity={"kind": "fully_elastic", "min": 1, "max": 4, "pool": "p"}))
    patched = merge_patch(base, {"elasticity": {"kind": "max_count", "max": 2}})
    assert patched.to_json()["elasticity"] == {"kind": "max_count", "max": 2}


def test_patch_keeps_fields_it_does_not_name() -> None:
    base = parse_spec(spec(kind="priority", providerRef="aws", description="d"))
    patched = merge_patch(base, {"description": "new"})
    assert patched.to_json() == {
        "name": "gpu",
        "kind": "priority",
        "providerRef": "aws",
        "description": "new",
    }


def test_patch_null_clears_a_field_and_kind_returns_to_fifo() -> None:
    base = parse_spec(spec(kind="filo", providerRef="aws"))
    patched = merge_patch(base, {"providerRef": None, "kind": None})
    assert patched.to_json() == {"name": "gpu", "kind": "fifo"}


def test_patch_revalidates_the_whole_record() -> None:
    base = parse_spec(spec(elasticity={"kind": "fully_elastic", "min": 2, "max": 4}))
    with pytest.raises(InvalidInput) as caught:
        merge_patch(base, {"elasticity": {"kind": "fully_elastic", "min": 5, "max": 4}})
    assert caught.value.field == "elasticity.max"


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"name": "other"}, "name"), ({"state": "archived"}, "state"), ({"kind": "lifo"}, "kind")],
)
def test_patch_refuses_renames_state_and_bad_values(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        merge_patch(parse_spec(spec()), patch)
    assert caught.value.field == field


def test_patch_body_must_be_an_object() -> None:
    with pytest.raises(InvalidInput):
        merge_patch(parse_spec(spec()), ["kind", "filo"])


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("fully-elastic", "fully_elastic"),
        ("pool-with-threshold", "pool_with_threshold"),
        ("max-count", "max_count"),
        ("fixed", "fixed"),
        ("fully_elastic", "fully_elastic"),
        (" Max-Count ", "max_count"),
    ],
)
def test_cli_spellings_normalize_to_the_stored_kind(typed: str, stored: str) -> None:
    assert normalize_elasticity_kind(typed) == stored


def test_the_record_uses_camel_case_top_level_and_snake_case_inside() -> None:
    schema = QueueSpec.model_json_schema(by_alias=True)
    assert {
        "kindParams",
        "reservedSlots",
        "providerRef",
        "daemonTemplate",
        "customScalerUdf",
    } <= set(schema["properties"])
    assert "threshold_low" in schema["$defs"]["Elasticity"]["properties"]
    assert "cloudTags" in schema["$defs"]["DaemonTemplate"]["properties"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (spec(description="a\x00b"), "description"),
        (spec(authPolicy={"k": ["ok", "no\x00"]}), "authPolicy.k[1]"),
        (spec(elasticity={"kind": "fixed", "future": {"x": "\x00"}}), "elasticity.future.x"),
    ],
)
def test_nul_characters_are_refused_anywhere(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(body)
    assert caught.value.field == field
    assert "NUL" in caught.value.message


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (spec(reservedSlots=2**31), "reservedSlots", "less than or equal to 2147483647"),
        (spec(elasticity={"kind": "fixed", "max": 2**63}), "elasticity.max", "less than or equal"),
        (spec(authPolicy="\ud800"), "authPolicy", "UTF-8"),
        (spec(authPolicy={"\ud800": 1}), "authPolicy.\\ud800", "UTF-8"),
        (spec(elasticity={"kind": "fixed", "x": "\udfff"}), "elasticity.x", "UTF-8"),
        (spec(authPolicy=nested(40)), "authPolicy" + "[0]" * 31, "deeper than 32"),
    ],
)
def test_values_no_store_could_keep_are_refused(
    body: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(body)
    assert caught.value.field == field
    assert words in caught.value.message
    caught.value.message.encode("utf-8")  # the refusal itself can always be sent


def test_an_unknown_kind_with_a_surrogate_is_reported_encodably() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(spec(elasticity={"kind": "\ud800"}))
    assert caught.value.field == "elasticity.kind"
    caught.value.message.encode("utf-8")


def test_moderate_nesting_in_free_form_json_is_fine() -> None:
    elasticity = {"kind": "fixed", "future": nested(20)}
    assert parse_spec(spec(elasticity=elasticity)).elasticity is not None


@pytest.mark.parametrize(
    ("policy", "field", "message"),
    [
        (["ci"], "authPolicy", "is an object"),
        ({"write": ["ci"]}, "authPolicy.write", "not an action; use submit, read, claim"),
        ({"submit": "ci"}, "authPolicy.submit", "a list of at most 256"),
        ({"read": ["ok", 7]}, "authPolicy.read[1]", "a token's name or id"),
        ({"claim": [""]}, "authPolicy.claim[0]", "1 to 256 characters"),
        ({"submit": ["x"] * 257}, "authPolicy.submit", "at most 256"),
    ],
)
def test_an_auth_policy_names_actions_and_tokens(policy: Any, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(spec(authPolicy=policy))
    assert caught.value.field == field
    assert message in str(caught.value)


# --- exact refusals, PATCH edges, numbers and the stored record ---------------------------


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ([], None, "a queue is a JSON object of its fields"),
        (spec(id="q_1"), "id", "id is set by the server"),
        (spec(namespaceId="ns"), "namespaceId", "namespaceId is set by the server"),
        (
            spec(state="paused"),
            "state",
            "state is set by the server; change it with drain, pause, resume, archive or unarchive",
        ),
        (
            spec(elasticity={"kind": "Fixed"}),
            "elasticity.kind",
            'elasticity.kind: unknown kind "Fixed"; expected one of fixed, fully_elastic, '
            "pool_with_threshold, max_count, wait_target",
        ),
    ],
)
def test_refusals_say_exactly_what_is_wrong(body: Any, field: str | None, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(body)
    assert (caught.value.field, caught.value.message) == (field, message)


@pytest.mark.parametrize(
    ("patch", "field", "message"),
    [
        (["kind", "filo"], None, "a PATCH body is a JSON object of the fields to replace"),
        ({"name": "other"}, "name", "a queue cannot be renamed"),
    ],
)
def test_patch_refusals_say_exactly_what_is_wrong(
    patch: Any, field: str | None, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        merge_patch(parse_spec(spec()), patch)
    assert (caught.value.field, caught.value.message) == (field, message)


@pytest.mark.parametrize("key", ["description", "providerRef", "elasticity", "admission"])
def test_patch_null_for_a_field_the_queue_does_not_have_changes_nothing(key: str) -> None:
    base = parse_spec(spec(kind="priority"))
    assert merge_patch(base, {key: None}) == base


def test_patch_naming_the_same_name_is_not_a_rename() -> None:
    base = parse_spec(spec(description="d"))
    assert merge_patch(base, {"name": "gpu", "description": "e"}).description == "e"


@pytest.mark.parametrize(
    ("elasticity", "message"),
    [
        (
            {"kind": "pool_with_threshold", "threshold": 0.3},
            "threshold_low (0.3, the default) must be below threshold (0.3)",
        ),
        (
            {"kind": "pool_with_threshold", "threshold_low": 0.8},
            "threshold_low (0.8) must be below threshold (0.8, the default)",
        ),
        (
            {"kind": "pool_with_threshold", "threshold": 0.3, "threshold_low": 0.3},
            "threshold_low (0.3) must be below threshold (0.3)",
        ),
    ],
)
def test_a_threshold_equal_to_its_low_default_or_written_is_refused(
    elasticity: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(spec(elasticity=elasticity))
    assert caught.value.field == "elasticity.threshold_low"
    assert caught.value.message == f"elasticity.threshold_low: {message}"


def test_the_default_low_binds_only_the_kind_that_reads_it() -> None:
    parsed = parse_spec(spec(elasticity={"kind": "fully_elastic", "threshold": 0.3}))
    assert parsed.elasticity is not None and parsed.elasticity.threshold == 0.3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (spec(kindParams={"temperature": "0.5"}), "kindParams.temperature"),
        (spec(admission={"rate_limit": "2"}), "admission.rate_limit"),
        (spec(admission={"deadline_cutoff_s": "60"}), "admission.deadline_cutoff_s"),
        (spec(elasticity={"kind": "fixed", "threshold": "0.5"}), "elasticity.threshold"),
        (spec(elasticity={"kind": "fixed", "threshold_low": "0.1"}), "elasticity.threshold_low"),
        (spec(elasticity={"kind": "fixed", "steal_delay_s": "5"}), "elasticity.steal_delay_s"),
    ],
)
def test_numeric_strings_are_not_numbers(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(body)
    assert caught.value.field == field
    assert caught.value.message == f"{field}: Input should be a valid number"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            spec(authPolicy={"k": [float("nan")]}),
            "k[0]: NaN and infinite numbers are not valid JSON",
        ),
        (spec(authPolicy="a\x00"), "text may not contain NUL characters"),
        (
            spec(elasticity={"kind": "fixed", "future": {"x": "\ud800"}}),
            "future.x: text must be valid UTF-8 (it holds a lone surrogate)",
        ),
    ],
)
def test_a_stored_record_read_back_is_checked_for_what_no_store_keeps(
    body: dict[str, Any], message: str
) -> None:
    # the store validates rows with the model itself, without parse_spec's whole-body check
    with pytest.raises(ValidationError) as caught:
        QueueSpec.model_validate(body)
    assert [e["msg"] for e in caught.value.errors()] == [f"Value error, {message}"]


def test_the_record_is_json_even_for_free_form_values_built_in_python() -> None:
    built = QueueSpec.model_validate(spec(authPolicy={"roles": ("admin", "dev")}))
    assert built.to_json() == {
        "name": "gpu",
        "kind": "fifo",
        "authPolicy": {"roles": ["admin", "dev"]},
    }


def test_a_stored_queue_shows_its_server_fields_around_its_spec() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    stored = Queue(
        id="q_1",
        namespace_id="ns_1",
        spec=parse_spec(spec(kind="filo")),
        state="paused",
        created_at=created,
        updated_at=created + timedelta(minutes=1),
    )
    assert stored.name == "gpu"
    assert stored.to_json() == {
        "id": "q_1",
        "namespaceId": "ns_1",
        "name": "gpu",
        "kind": "filo",
        "state": "paused",
        "createdAt": "2026-01-02T03:04:05+00:00",
        "updatedAt": "2026-01-02T03:05:05+00:00",
    }
