//! How `ha-mode` policies pick a mirrored classic queue's members.

use super::*;

#[test]
fn ha_policies_map_to_group_sizes_and_nodes() {
    let def = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    assert_eq!(
        ha_members(&def(serde_json::json!({"ha-mode": "all"}))),
        Some(Ha::Size(usize::MAX))
    );
    assert_eq!(
        ha_members(&def(
            serde_json::json!({"ha-mode": "exactly", "ha-params": 2})
        )),
        Some(Ha::Size(3)),
        "two members could not survive the loss of one"
    );
    assert_eq!(
        ha_members(&def(
            serde_json::json!({"ha-mode": "exactly", "ha-params": 5})
        )),
        Some(Ha::Size(5))
    );
    assert_eq!(
        ha_members(&def(
            serde_json::json!({"ha-mode": "nodes", "ha-params": ["a@h", "b@h"]})
        )),
        Some(Ha::Nodes(vec!["a@h".into(), "b@h".into()]))
    );
    assert_eq!(
        ha_members(&def(serde_json::json!({"ha-mode": "exactly"}))),
        None
    );
    assert_eq!(ha_members(&def(serde_json::json!({"max-length": 3}))), None);
}
