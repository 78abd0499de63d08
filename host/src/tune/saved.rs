//! Reading a decision maker's saved state back: shared by every scheduler,
//! searcher and stopper, and importing none of them.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Reads the `state` a scheduler or searcher saved as its own type: `None`
/// for `null` (nothing was saved: the fresh state stands), an error naming
/// `what` when it does not fit. Reads from the borrowed value, so a large
/// state (PBT's members) is not copied first.
pub(crate) fn read_saved<T: DeserializeOwned>(
    state: &Value,
    what: &str,
) -> Result<Option<T>, String> {
    if state.is_null() {
        return Ok(None);
    }
    T::deserialize(state)
        .map(Some)
        .map_err(|e| format!("the saved {what} state cannot be read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn saved_states_read_as_their_type_and_bad_ones_are_named() {
        assert_eq!(read_saved::<u64>(&Value::Null, "X"), Ok(None));
        assert_eq!(
            read_saved::<Vec<u64>>(&json!([1, 2]), "X"),
            Ok(Some(vec![1, 2]))
        );
        let message = read_saved::<Vec<u64>>(&json!({"a": 1}), "HyperBand").unwrap_err();
        assert!(
            message.starts_with("the saved HyperBand state cannot be read: "),
            "{message}"
        );
    }
}
