mod common;
use common::*;
use std::time::Duration;
#[tokio::test(flavor = "multi_thread")]
async fn probe_status() {
    let db = MariaDb::start();
    let broker = Broker::start(Engine::Memory);
    let mut connector = Connector::start(&db, &broker, "");
    let writer = Writer::start(db.opts_root(), WriterConfig { max_events: 100000, pause: Duration::from_millis(3), ..Default::default() });
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        eprintln!("running {i}: {:?}", connector.try_status_json().map(|v| v.map(|v| v["position"].clone())));
    }
    connector.kill();
    eprintln!("after kill: {:?}", connector.try_status_json().map(|v| v.map(|v| v["position"].clone())));
    connector.restart();
    for i in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        eprintln!("restarted {i}: {:?}", connector.try_status_json().map(|v| v.map(|v| v["position"].clone())));
    }
    connector.terminate();
    eprintln!("after terminate: {:?}", connector.try_status_json().map(|v| v.map(|v| v["position"].clone())));
    writer.finish().await;
}
