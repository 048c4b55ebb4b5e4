//! Super streams, as `rabbitmq-streams add_super_stream` / `delete_super_stream` make and
//! remove them, through the HTTP API: a durable direct exchange (`x-super-stream`), a stream
//! per partition, bound with the partition's routing key and `x-stream-partition-order`.

use clap::Args;
use serde_json::{json, Map, Value};

use super::api::{fail, seg, Api, Failure};
use super::view::info;
use super::VhostOpt;

// Not a doc comment: clap would show it as the command's help.
#[derive(Args)]
pub(super) struct AddSuperStreamArgs {
    #[command(flatten)]
    v: VhostOpt,
    name: String,
    /// Partitions NAME-0 .. NAME-(N-1), bound with keys 0 .. N-1.
    #[arg(long, conflicts_with = "binding_keys")]
    partitions: Option<u32>,
    /// Partitions NAME-KEY, one per comma-separated key.
    #[arg(long = "binding-keys")]
    binding_keys: Option<String>,
    #[arg(long = "max-length-bytes")]
    max_length_bytes: Option<u64>,
    #[arg(long = "max-age")]
    max_age: Option<String>,
    #[arg(long = "stream-max-segment-size-bytes")]
    segment_bytes: Option<u64>,
    #[arg(long = "leader-locator")]
    leader_locator: Option<String>,
    #[arg(long = "initial-cluster-size")]
    initial_cluster_size: Option<u64>,
}

/// The partitions (name, binding key) of a super stream named `name`.
fn partitions(
    name: &str,
    count: Option<u32>,
    keys: Option<&str>,
) -> Result<Vec<(String, String)>, Failure> {
    let keys: Vec<String> = match (count, keys) {
        (_, Some(k)) => k
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(String::from)
            .collect(),
        (Some(n), None) => (0..n).map(|i| i.to_string()).collect(),
        (None, None) => (0..3).map(|i| i.to_string()).collect(),
    };
    if keys.is_empty() {
        return Err(fail("a super stream needs at least one partition"));
    }
    Ok(keys
        .into_iter()
        .map(|k| (format!("{name}-{k}"), k))
        .collect())
}

pub(super) fn add_super_stream(
    api: &Api,
    quiet: bool,
    a: &AddSuperStreamArgs,
) -> Result<(), Failure> {
    let v = &a.v.vhost;
    let parts = partitions(&a.name, a.partitions, a.binding_keys.as_deref())?;
    info(
        quiet,
        format!("Adding super stream {} in vhost {v} ...", a.name),
    );
    let x_path = format!("/api/exchanges/{}/{}", seg(v), seg(&a.name));
    if api.get(&x_path)?.is_some() {
        return Err(fail(format!(
            "there is already an exchange named {}",
            a.name
        )));
    }
    for (p, _) in &parts {
        if api
            .get(&format!("/api/queues/{}/{}", seg(v), seg(p)))?
            .is_some()
        {
            return Err(fail(format!("there is already a queue named {p}")));
        }
    }
    let mut args = Map::new();
    args.insert("x-queue-type".into(), "stream".into());
    if let Some(n) = a.max_length_bytes {
        args.insert("x-max-length-bytes".into(), n.into());
    }
    if let Some(s) = &a.max_age {
        args.insert("x-max-age".into(), s.clone().into());
    }
    if let Some(n) = a.segment_bytes {
        args.insert("x-stream-max-segment-size-bytes".into(), n.into());
    }
    if let Some(n) = a.initial_cluster_size {
        args.insert("x-initial-cluster-size".into(), n.into());
    }
    args.insert(
        "x-queue-leader-locator".into(),
        a.leader_locator
            .clone()
            .unwrap_or_else(|| "balanced".into())
            .into(),
    );
    let made = (|| -> Result<(), Failure> {
        api.call(
            "PUT",
            &x_path,
            Some(
                &json!({"type": "direct", "durable": true, "arguments": {"x-super-stream": true}}),
            ),
            &[],
        )?;
        for (order, (p, key)) in parts.iter().enumerate() {
            api.call(
                "PUT",
                &format!("/api/queues/{}/{}", seg(v), seg(p)),
                Some(&json!({"durable": true, "arguments": Value::Object(args.clone())})),
                &[],
            )?;
            api.call(
                "POST",
                &format!("/api/bindings/{}/e/{}/q/{}", seg(v), seg(&a.name), seg(p)),
                Some(
                    &json!({"routing_key": key, "arguments": {"x-stream-partition-order": order}}),
                ),
                &[],
            )?;
        }
        Ok(())
    })();
    if made.is_err() {
        // As RabbitMQ: what was made goes again.
        for (p, _) in &parts {
            let _ = api.call(
                "DELETE",
                &format!("/api/queues/{}/{}", seg(v), seg(p)),
                None,
                &[],
            );
        }
        let _ = api.call("DELETE", &x_path, None, &[]);
    }
    made
}

pub(super) fn delete_super_stream(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    name: &str,
) -> Result<(), Failure> {
    let v = &v.vhost;
    info(
        quiet,
        format!("Deleting super stream {name} in vhost {v} ..."),
    );
    let bindings = api
        .get(&format!(
            "/api/exchanges/{}/{}/bindings/source",
            seg(v),
            seg(name)
        ))?
        .ok_or_else(|| fail(format!("super stream {name} in vhost {v} does not exist")))?;
    api.call(
        "DELETE",
        &format!("/api/exchanges/{}/{}", seg(v), seg(name)),
        None,
        &[],
    )?;
    for b in bindings.as_array().into_iter().flatten() {
        if b["destination_type"] == "queue" {
            if let Some(q) = b["destination"].as_str() {
                api.call(
                    "DELETE",
                    &format!("/api/queues/{}/{}", seg(v), seg(q)),
                    None,
                    &[],
                )?;
            }
        }
    }
    Ok(())
}
