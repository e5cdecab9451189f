use super::*;

fn lim() -> ResultsLimits {
    ResultsLimits::default()
}

fn post(t: &mut Tracking, route: &str, body: Value) -> Reply {
    handle(
        t,
        "POST",
        &format!("/api/2.0/mlflow/{route}"),
        "",
        body.to_string().as_bytes(),
        1000,
        &lim(),
    )
}

#[test]
fn a_script_s_calls_become_points_params_and_tags_and_runs_get_reads_them_back() {
    let mut t = Tracking::new(7, 2, 1000);
    let r = handle(
        &mut t,
        "GET",
        "/api/2.0/mlflow/experiments/get-by-name",
        "experiment_name=sweep",
        b"",
        1000,
        &lim(),
    );
    assert_eq!(
        (r.status, r.body["error_code"].as_str()),
        (404, Some("RESOURCE_DOES_NOT_EXIST"))
    );
    let r = post(&mut t, "experiments/create", json!({"name": "sweep"}));
    assert_eq!(r.body["experiment_id"], "1");
    let r = post(
        &mut t,
        "runs/create",
        json!({"experiment_id": "1", "start_time": 5, "tags": [{"key": "mlflow.user", "value": "alice"}]}),
    );
    let id = r.body["run"]["info"]["run_id"].as_str().unwrap().to_string();
    assert_eq!(r.batch.unwrap().tags[0], ("mlflow.user".into(), "alice".into()));
    let r = post(
        &mut t,
        "runs/log-metric",
        json!({"run_id": id, "key": "loss", "value": "NaN", "timestamp": 9, "step": "3"}),
    );
    let p = &r.batch.unwrap().points[0];
    assert!(p.value.is_nan() && p.step == Some(3) && p.at == 9 && p.name == "loss");
    let r = post(
        &mut t,
        "runs/log-batch",
        json!({"run_id": id, "metrics": [{"key": "acc", "value": 0.5, "timestamp": 1, "step": 2}],
               "params": [{"key": "lr", "value": "0.01"}], "tags": [{"key": "stage", "value": "dev"}]}),
    );
    let b = r.batch.unwrap();
    assert_eq!((b.points.len(), b.params.len(), b.tags.len()), (1, 1, 1));
    post(
        &mut t,
        "runs/update",
        json!({"run_id": id, "status": "FINISHED", "end_time": 10}),
    );
    let r = handle(
        &mut t,
        "GET",
        "/api/2.0/mlflow/runs/get",
        &format!("run_uuid={id}&run_id={id}"),
        b"",
        1000,
        &lim(),
    );
    let run = &r.body["run"];
    assert_eq!(run["info"]["status"], "FINISHED");
    assert_eq!(run["data"]["params"][0], json!({"key": "lr", "value": "0.01"}));
    let loss = run["data"]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "loss")
        .unwrap();
    assert_eq!(loss["value"], "NaN");
}

#[test]
fn anything_else_is_an_mlflow_shaped_error_naming_what_is_supported() {
    let mut t = Tracking::new(1, 1, 0);
    let r = post(&mut t, "artifacts/list", json!({}));
    assert_eq!(
        (r.status, r.body["error_code"].as_str()),
        (404, Some("ENDPOINT_NOT_FOUND"))
    );
    assert!(
        r.body["message"].as_str().unwrap().contains("runs/log-batch"),
        "{}",
        r.body
    );
    let r = handle(&mut t, "GET", "/", "", b"", 0, &lim());
    assert_eq!(r.status, 404);
    let r = post(
        &mut t,
        "runs/log-metric",
        json!({"run_id": "nope", "key": "x", "value": 1}),
    );
    assert_eq!(
        (r.status, r.body["error_code"].as_str()),
        (404, Some("RESOURCE_DOES_NOT_EXIST"))
    );
    let r = handle(&mut t, "POST", "/api/2.0/mlflow/runs/create", "", b"[1,2", 0, &lim());
    assert_eq!(
        (r.status, r.body["error_code"].as_str()),
        (400, Some("INVALID_PARAMETER_VALUE"))
    );
    let id = post(&mut t, "runs/create", json!({}))["run"]["info"]["run_id"].clone();
    let many: Vec<Value> = (0..1001).map(|i| json!({"key": "m", "value": i, "step": i})).collect();
    let r = post(&mut t, "runs/log-batch", json!({"run_id": id, "metrics": many}));
    assert_eq!(r.status, 400, "{}", r.body);
}

impl std::ops::Index<&str> for Reply {
    type Output = Value;
    fn index(&self, k: &str) -> &Value {
        &self.body[k]
    }
}

#[test]
fn the_endpoint_is_read_back_from_the_container_s_environment_and_the_token_is_required() {
    let env = endpoint_env(&BTreeMap::new()).unwrap();
    let as_env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let (port, token) = endpoint_of(&as_env).unwrap();
    assert!(PORTS.contains(&port) && token.len() == 48);
    assert_ne!(
        endpoint_env(&BTreeMap::new()).unwrap()[1],
        env[1],
        "a token per attempt"
    );
    let own = BTreeMap::from([(URI_VAR.to_string(), "http://mlflow.lab:5000".to_string())]);
    assert!(endpoint_env(&own).is_none());
    assert!(authorized(Some(format!("Bearer {token}").as_bytes()), &token));
    assert!(!authorized(Some(b"Bearer wrong"), &token));
    assert!(!authorized(None, &token));
}

#[test]
fn after_an_engine_restart_the_attempt_s_own_runs_are_taken_up_again_and_no_other() {
    let mut before = Tracking::new(7, 2, 0);
    let id = post(&mut before, "runs/create", json!({}))["run"]["info"]["run_id"].clone();
    // The restarted engine knows nothing of it; the client goes on with its run id.
    let mut t = Tracking::new(7, 2, 5);
    let r = post(
        &mut t,
        "runs/log-metric",
        json!({"run_id": id, "key": "loss", "value": 0.5, "step": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let other = format!("{:016x}{:08x}{:08x}", 8, 2, 0);
    let r = post(
        &mut t,
        "runs/set-tag",
        json!({"run_id": other, "key": "k", "value": "v"}),
    );
    assert_eq!(r.status, 404, "another job's run id is not taken up");
    let next = post(&mut t, "runs/create", json!({}))["run"]["info"]["run_id"].clone();
    assert_ne!(next, id);
}
