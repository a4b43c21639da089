import pytest

from coordinator.config import Config, ConfigError, load


def test_defaults_match_kafka():
    c = Config()
    assert (c.offsets_partitions, c.initial_rebalance_delay_ms, c.min_session_timeout_ms,
            c.max_session_timeout_ms, c.offsets_retention_minutes, c.offset_metadata_max_bytes,
            c.max_frame_size, c.connections_max_idle_ms, c.fsync) == (
        50, 3000, 6000, 1800000, 10080, 4096, 8 * 1024 * 1024, 600000, "always")


def test_precedence_toml_env_flags(tmp_path):
    toml = tmp_path / "herd.toml"
    toml.write_text('offsets_partitions = 7\ngroup_max_size = 5\nfsync = "never"\n'
                    'topics = ["a:2", {name = "b", partitions = 3}]\n')
    c = load(str(toml), env={"HERD_GROUP_MAX_SIZE": "9", "HERD_UNRELATED": "x"},
             overrides={"fsync": "always", "port": None})
    assert (c.offsets_partitions, c.group_max_size, c.fsync) == (7, 9, "always")
    assert c.topics == (("a", 2), ("b", 3))


@pytest.mark.parametrize("env, message", [
    ({"HERD_PORT": "http"}, "port must be an integer"),
    ({"HERD_FSYNC": "sometimes"}, "fsync must be"),
    ({"HERD_OFFSETS_PARTITIONS": "0"}, "offsets_partitions must be positive"),
    ({"HERD_AUTO_CREATE_TOPICS": "maybe"}, "true or false"),
    ({"HERD_MIN_SESSION_TIMEOUT_MS": "10", "HERD_MAX_SESSION_TIMEOUT_MS": "5"}, "max_session_timeout_ms"),
    ({"HERD_TOPICS": "bad topic:1"}, "invalid topic name"),
    ({"HERD_TOPICS": "orders"}, "HERD_TOPICS: wants NAME:PARTITIONS, got 'orders': give the partition count"),
])
def test_bad_values_give_one_clear_message(env, message):
    with pytest.raises(ConfigError, match=message):
        load(env=env)


def test_unknown_toml_key_and_missing_file(tmp_path):
    toml = tmp_path / "x.toml"
    toml.write_text("no_such_setting = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'no_such_setting'"):
        load(str(toml), env={})
    with pytest.raises(ConfigError, match="config file not found"):
        load(str(tmp_path / "missing.toml"), env={})
    toml.write_text("port = [\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(str(toml), env={})


@pytest.mark.parametrize("toml, message", [
    ("port = 1.5", "port must be an integer, got 1.5"),
    ("port = 9092.0", "port must be an integer"),
    ('topics = [{name = "a", partitions = "x"}]', "topics partitions must be an integer, got 'x'"),
    ('topics = [["a", "x"]]', "topics partitions must be an integer"),
    ("topics = [3]", "topics wants"),
    ('topics = ["orders"]', "topics: wants NAME:PARTITIONS, got 'orders'"),
    ('host = ""', "host must not be empty (use 0.0.0.0"),
    ('advertised_host = " "', "advertised_host must not be empty"),
    ("advertised_port = 99999", "advertised_port must be 1-65535, got 99999"),
    ("advertised_port = 0", "advertised_port must be 1-65535"),
])
def test_toml_values_are_checked_not_coerced(tmp_path, toml, message):
    path = tmp_path / "herd.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError) as info:
        load(str(path), env={})
    assert message in str(info.value)


def test_errors_name_where_the_value_came_from(tmp_path):
    with pytest.raises(ConfigError, match=r"^HERD_PORT: port must be an integer, got 'abc'$"):
        load(env={"HERD_PORT": "abc"})
    with pytest.raises(ConfigError, match=r"^--port: port must be an integer"):
        load(env={}, overrides={"port": "abc"})
    path = tmp_path / "herd.toml"
    path.write_text('fsync = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"herd.toml: fsync: fsync must be"):
        load(str(path), env={})


def test_misspelt_environment_variables_are_reported_with_a_suggestion():
    from coordinator.config import unknown_env
    env = {"HERD_OFFSET_PARTITIONS": "3", "HERD_BOOTSTRAP": "x:1", "HERD_PORT": "1", "HERD_BENCH_QUICK": "1",
           "PATH": "/bin"}
    assert unknown_env(env) == [("HERD_OFFSET_PARTITIONS", "HERD_OFFSETS_PARTITIONS")]


def test_a_herd_table_with_settings_outside_it_is_refused(tmp_path):
    path = tmp_path / "herd.toml"
    path.write_text('fsync = "bogus"\n[herd]\nport = 1234\n')
    with pytest.raises(ConfigError, match=r"settings outside it \(fsync\)"):
        load(str(path), env={})
    path.write_text('[herd]\nport = 1234\n')
    assert load(str(path), env={}).port == 1234


def test_a_kubernetes_service_link_named_herd_is_not_the_port_setting():
    # a Service named "herd" puts these in every pod of its namespace (enableServiceLinks)
    env = {"HERD_PORT": "tcp://10.96.12.7:9092", "HERD_SERVICE_HOST": "10.96.12.7", "HERD_SERVICE_PORT": "9092",
           "HERD_PORT_9092_TCP": "tcp://10.96.12.7:9092", "HERD_PORT_9092_TCP_PORT": "9092"}
    from coordinator.config import unknown_env

    assert load(None, env).port == 9092
    assert load(None, env, {"port": "19092"}).port == 19092
    assert load(None, {**env, "HERD_PORT": "19092"}).port == 19092  # a real port still counts
    assert unknown_env(env) == []


def test_a_kubernetes_service_link_named_herd_metrics_is_not_the_metrics_port_setting():
    # a Service named "herd-metrics" (for Prometheus) sets HERD_METRICS_PORT in every pod
    env = {"HERD_METRICS_PORT": "tcp://10.96.12.8:9404", "HERD_METRICS_SERVICE_HOST": "10.96.12.8"}
    assert load(None, env).metrics_port is None
    assert load(None, {**env, "HERD_ADVERTISED_PORT": "tcp://10.96.12.9:9092"}).advertised_port is None
    assert load(None, {"HERD_METRICS_PORT": "9404"}).metrics_port == 9404  # a real port still counts


def test_lag_settings_by_their_issue_names():
    c = load(env={"HERD_DATA_BOOTSTRAP_SERVER": "kafka1:9092,kafka2:9093", "HERD_LAG_METRICS": "group"},
             overrides={"data_command_config": "client.properties", "lag_refresh_interval_ms": "5000"})
    assert (c.data_bootstrap_server, c.data_command_config, c.lag_metrics, c.lag_refresh_interval_ms,
            c.lag_history_size) == ("kafka1:9092,kafka2:9093", "client.properties", "group", 5000, 30)
    d = Config()
    assert (d.data_bootstrap_server, d.lag_refresh_interval_ms, d.lag_metrics) == (None, 30000, "partition")


@pytest.mark.parametrize("env, message", [
    ({"HERD_DATA_BOOTSTRAP_SERVER": "kafka1"}, "HERD_DATA_BOOTSTRAP_SERVER: data_bootstrap_server wants HOST:PORT"),
    ({"HERD_DATA_BOOTSTRAP_SERVER": "kafka1:99999"}, "wants HOST:PORT"),
    ({"HERD_DATA_COMMAND_CONFIG": "x.properties"}, "data_bootstrap_server is not"),
    ({"HERD_LAG_METRICS": "topic"}, "lag_metrics must be 'partition' or 'group'"),
    ({"HERD_LAG_HISTORY_SIZE": "1"}, "lag_history_size must be at least 2"),
    ({"HERD_LAG_REFRESH_INTERVAL_MS": "0"}, "lag_refresh_interval_ms must be positive"),
])
def test_bad_lag_settings_give_one_clear_message(env, message):
    with pytest.raises(ConfigError, match=message):
        load(env=env)


def test_authorization_settings_by_their_issue_names(tmp_path):
    c = Config()
    assert (c.authorizer, c.super_users, c.allow_everyone_if_no_acl_found) == ("none", "", False)
    toml = tmp_path / "herd.toml"
    toml.write_text('authorizer = "acl"\nsuper_users = "User:admin;User:ops"\n')
    c = load(str(toml), env={"HERD_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "true"}, overrides={})
    assert (c.authorizer, c.super_users, c.allow_everyone_if_no_acl_found) == ("acl", "User:admin;User:ops", True)
    c = load(env={"HERD_AUTHORIZER": "acl"}, overrides={"super_users": "User:root"})
    assert (c.authorizer, c.super_users) == ("acl", "User:root")


@pytest.mark.parametrize("env, message", [
    ({"HERD_AUTHORIZER": "ranger"}, "authorizer must be 'none' or 'acl'"),
    ({"HERD_SUPER_USERS": "admin"}, "super_users wants User:NAME"),
    ({"HERD_SSL_PRINCIPAL_MAPPING_RULES": "RULE:abc"}, "ssl_principal_mapping_rules"),
])
def test_bad_authorization_settings_give_one_clear_message(env, message):
    with pytest.raises(ConfigError, match=message):
        load(env=env)


def test_http_auth_file_from_toml_env_and_flag(tmp_path):
    toml = tmp_path / "herd.toml"
    toml.write_text('http_auth_file = "/etc/herd/http-auth"\n')
    assert load(env={}).http_auth_file is None
    assert load(str(toml), env={}).http_auth_file == "/etc/herd/http-auth"
    assert load(str(toml), env={"HERD_HTTP_AUTH_FILE": "/e"}).http_auth_file == "/e"
    assert load(str(toml), env={"HERD_HTTP_AUTH_FILE": "/e"}, overrides={"http_auth_file": "/f"}).http_auth_file == "/f"
    with pytest.raises(ConfigError, match="http_auth_file must not be empty"):
        load(env={"HERD_HTTP_AUTH_FILE": " "})


def test_authorizer_acl_resolves_consumer_regexes_with_acls():
    assert Config(authorizer="acl").validate().group_config().consumer.authorize_regex is True
    assert Config().validate().group_config().consumer.authorize_regex is False
