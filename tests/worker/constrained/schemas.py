"""JSON schemas for the suite: every kind of bound (ranges, lengths, patterns, array sizes,
enums, nesting, references), each small enough that greedy decoding on the bundled model
finishes within the token budget (strings have a maxLength, arrays a maxItems)."""

from __future__ import annotations

import json
from typing import Any

NAME = {"type": "string", "minLength": 1, "maxLength": 16}

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat_person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    "bool_and_null": {
        "type": "object",
        "properties": {"active": {"type": "boolean"}, "parent": {"type": "null"}},
        "required": ["active", "parent"],
    },
    "enum_color": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    "enum_mixed": {
        "type": "object",
        "properties": {"level": {"enum": [1, 2, 3, "max"]}, "ok": {"const": True}},
        "required": ["level", "ok"],
    },
    "integer_range": {
        "type": "object",
        "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
        "required": ["year"],
    },
    "negative_range": {
        "type": "object",
        "properties": {"celsius": {"type": "integer", "minimum": -40, "maximum": -1}},
        "required": ["celsius"],
    },
    "number_range": {
        "type": "object",
        "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000}},
        "required": ["price"],
    },
    "string_pattern": {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["zip"],
    },
    "pattern_code": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
    },
    "string_lengths": {
        "type": "object",
        "properties": {"initials": {"type": "string", "minLength": 2, "maxLength": 3}},
        "required": ["initials"],
    },
    "array_bounds": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3},
        },
        "required": ["tags"],
    },
    "array_of_ints": {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 100},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": NAME,
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    "nested_object": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": NAME,
                    "address": {
                        "type": "object",
                        "properties": {"city": NAME, "country": NAME},
                        "required": ["city", "country"],
                    },
                },
                "required": ["name", "address"],
            }
        },
        "required": ["user"],
    },
    "optional_fields": {
        "type": "object",
        "properties": {
            "title": NAME,
            "subtitle": NAME,
            "pages": {"type": "integer", "minimum": 1, "maximum": 999},
        },
        "required": ["title"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, NAME]},
        },
        "required": ["id"],
    },
    "top_level_array": {
        "type": "array",
        "items": {"enum": ["a", "b", "c"]},
        "minItems": 2,
        "maxItems": 3,
    },
    "top_level_enum": {"enum": ["north", "south", "east", "west"]},
    "ref_defs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "long_fixed_keys": {
        "type": "object",
        "properties": {
            "customer_full_legal_name": NAME,
            "customer_primary_email_address": {"type": "string", "maxLength": 24},
            "number_of_previous_orders_placed": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": [
            "customer_full_legal_name",
            "customer_primary_email_address",
            "number_of_previous_orders_placed",
        ],
    },
    "exclusive_bounds": {
        "type": "object",
        "properties": {"rating": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 6}},
        "required": ["rating"],
    },
    "nested_arrays": {
        "type": "object",
        "properties": {
            "grid": {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 1},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "minItems": 2,
                "maxItems": 2,
            }
        },
        "required": ["grid"],
    },
}


def schema_requests(tokenizer: Any, names: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """Chat prompts asking for a sample record of each named schema, and greedy params
    (160 new tokens) constrained by it."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Reply with JSON for a sample '{n}' record."}]
        )
        for n in names
    ]
    params = [
        {"temperature": 0, "max_new_tokens": 160, "json_schema": json.dumps(SCHEMAS[n])}
        for n in names
    ]
    return prompts, params


def integer_ranges(n: int, salt: int = 0) -> str:
    """n properties, each an integer between two 9-digit bounds."""
    props = {
        f"field_{i:03}": {
            "type": "integer",
            "minimum": -123456789 - i - salt,
            "maximum": 987654321 + i + salt,
        }
        for i in range(n)
    }
    return json.dumps({"type": "object", "properties": props})


def number_ranges(n: int) -> str:
    props = {
        f"f{i:03}": {"type": "number", "minimum": -12345.678 - i, "maximum": 98765.4321 + i}
        for i in range(n)
    }
    return json.dumps({"type": "object", "properties": props})
