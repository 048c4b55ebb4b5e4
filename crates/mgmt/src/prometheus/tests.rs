use std::collections::HashSet;

use warren_broker::config::Config;

use super::*;

fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn broker() -> Arc<Broker> {
    let dir = std::env::temp_dir().join(format!(
        "warren-prometheus-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    Broker::new(Config {
        data_dir: dir,
        ..Config::default()
    })
    .expect("broker")
}

/// The sample lines' names and labels (everything before the value).
fn series(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s))
        .collect()
}

#[test]
fn detailed_takes_repeated_families_and_vhosts() {
    let s = Scope::detailed(&q(&[
        ("family", "queue_coarse_metrics"),
        ("family", "ra_metrics"),
        ("vhost", "a"),
        ("vhost", "b"),
    ]))
    .expect("valid");
    assert!(s.per_object && s.is_detailed());
    assert!(s.wants(Family::QueueCoarse) && s.wants(Family::Ra));
    assert!(!s.wants(Family::Channel));
    assert!(s.shows_vhost("a") && s.shows_vhost("b") && !s.shows_vhost("/"));
    let all = Scope::detailed(&q(&[("family", "queue_metrics")])).expect("valid");
    assert!(all.shows_vhost("/"), "no vhost parameter: every vhost");
}

#[test]
fn detailed_refuses_what_rabbitmq_does_not_know() {
    let e = Scope::detailed(&q(&[("family", "queue_coarse")])).err();
    assert!(e.is_some_and(|e| e.contains("unknown metric family") && e.contains("queue_coarse_metrics")));
    let e = Scope::detailed(&q(&[("vhosts", "/")])).err();
    assert!(e.is_some_and(|e| e.contains("vhosts")));
    // Known to RabbitMQ, no source here: accepted, renders nothing.
    assert!(Scope::detailed(&q(&[("family", "node_persister_metrics")])).is_ok());
}

#[test]
fn every_family_name_round_trips() {
    for f in Family::ALL {
        assert_eq!(Family::from_name(f.name()), Some(f));
    }
}

#[test]
fn aggregated_has_identity_compat_version_and_no_duplicate_series() {
    let b = broker();
    let text = render(&b, &Scope::aggregated());
    assert!(text.contains("rabbitmq_version=\"3.10.8\""), "{text}");
    // A single node without a cluster_name parameter is named after itself.
    assert!(text.contains(&format!(
        "rabbitmq_identity_info{{rabbitmq_node=\"{0}\",rabbitmq_cluster=\"{0}\"}} 1",
        b.config.node_name
    )));
    assert!(text.contains("rabbitmq_global_messages_received_total{protocol=\"amqp091\"} 0"));
    assert!(text.contains("rabbitmq_channel_messages_unconfirmed 0"));
    let all = series(&text);
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), unique.len(), "a series twice in one scrape");
    let families: Vec<_> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let unique: HashSet<_> = families.iter().collect();
    assert_eq!(families.len(), unique.len(), "a family twice");
    let _ = std::fs::remove_dir_all(&b.config.data_dir);
}

#[test]
fn detailed_renders_only_what_was_asked_with_its_prefix() {
    let b = broker();
    let scope = Scope::detailed(&q(&[("family", "connection_churn_metrics")])).expect("valid");
    let text = render(&b, &scope);
    assert!(
        text.contains("rabbitmq_detailed_connections_opened_total 0"),
        "{text}"
    );
    for name in series(&text) {
        assert!(
            name.starts_with("rabbitmq_detailed_connections_")
                || name.starts_with("rabbitmq_detailed_channels_")
                || name.starts_with("rabbitmq_detailed_queues_"),
            "{name}"
        );
    }
    let none = Scope::detailed(&[]).expect("valid");
    assert_eq!(render(&b, &none), "", "no family asked, nothing rendered");
    let _ = std::fs::remove_dir_all(&b.config.data_dir);
}
