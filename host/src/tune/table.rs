//! Parameters from a table, as an experiment file gives a scheduler's or a
//! searcher's: errors name the key at fault.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// `T` from `table` (the parameters of `section`, `"scheduler"` or
/// `"search"`, without `type`). A wrong value is reported as
/// `section.key: what is wrong`; a message that already names its key
/// (`section.key ...`, from a parameter's own check) is kept as it is.
pub(crate) fn from_table<T: DeserializeOwned>(
    table: Map<String, Value>,
    section: &str,
) -> Result<T, String> {
    serde_path_to_error::deserialize(Value::Object(table)).map_err(|e| {
        let (path, inner) = (e.path().to_string(), e.inner().to_string());
        // serde's message for an unknown key names it, and the path ends in it.
        let top_level_unknown = e.path().iter().count() == 1 && inner.starts_with("unknown field");
        if inner.starts_with(&format!("{section}.")) {
            inner
        } else if path == "." || top_level_unknown {
            format!("{section}: {inner}")
        } else {
            format!("{section}.{path}: {inner}")
        }
    })
}

/// A section whose `name` takes no parameters: `table` must be empty.
pub(crate) fn no_parameters(
    table: &Map<String, Value>,
    section: &str,
    name: &str,
) -> Result<(), String> {
    match table.keys().next() {
        None => Ok(()),
        Some(key) => Err(format!(
            "{section}: unknown key `{key}`: the {name} {section} takes no parameters"
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Knobs {
        gamma: f64,
        nested: Vec<u32>,
    }

    fn knobs(value: Value) -> Result<Knobs, String> {
        let Value::Object(table) = value else {
            unreachable!()
        };
        from_table(table, "search")
    }

    #[test]
    fn errors_name_the_key_at_fault() {
        let cases = [
            (
                json!({"gamma": "x"}),
                "search.gamma: invalid type: string \"x\", expected f64",
            ),
            (
                json!({"nested": [1, -2]}),
                "search.nested[1]: invalid value: integer `-2`",
            ),
            (json!({"gama": 1}), "search: unknown field `gama`, expected"),
        ];
        for (value, expected) in cases {
            let message = knobs(value).unwrap_err();
            assert!(
                message.starts_with(expected),
                "{message}\n expected: {expected}"
            );
        }
        assert_eq!(knobs(json!({"gamma": 0.5})).unwrap().gamma, 0.5);
    }

    #[test]
    fn a_section_without_parameters_refuses_any() {
        let mut table = Map::new();
        assert_eq!(no_parameters(&table, "scheduler", "fifo"), Ok(()));
        table.insert("grace".into(), json!(1));
        assert_eq!(
            no_parameters(&table, "scheduler", "fifo").unwrap_err(),
            "scheduler: unknown key `grace`: the fifo scheduler takes no parameters"
        );
    }
}
