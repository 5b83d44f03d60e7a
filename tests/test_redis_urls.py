"""hub/redis_urls.py without a Redis: what a Sentinel URL names, what is refused and how, and
that no password reaches a log line."""
import pytest

from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.redis_urls import parse_sentinel_url, redis_client, shown_url


def test_a_sentinel_url_names_its_sentinels_service_database_and_credentials():
    where = parse_sentinel_url("redis+sentinel://app:s3cret@10.0.0.5:26379,[::1]:26380/hub/2"
                               "?sentinel_password=other")
    assert where == {"sentinels": [("10.0.0.5", 26379), ("::1", 26380)], "service": "hub",
                     "db": 2, "username": "app", "password": "s3cret",
                     "sentinel_password": "other", "tls": {}}
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:26379/hub")["db"] == 0


@pytest.mark.parametrize("url", [
    "redis+sentinel://127.0.0.1:26379/",           # no service
    "redis+sentinel:///hub/0",                       # no sentinel
    "redis+sentinel://127.0.0.1/hub",               # no port
    "redis+sentinel://127.0.0.1:26379/hub/zero",    # not a database number
    "redis+sentinel://:pw@127.0.0.1:x/hub",
])
def test_a_malformed_sentinel_url_is_a_configuration_error_that_shows_the_form(url):
    with pytest.raises(ConfigurationError) as raised:
        parse_sentinel_url(url)
    assert "redis+sentinel://HOST:PORT" in str(raised.value)
    assert "pw" not in str(raised.value)


def test_no_password_is_shown():
    assert shown_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert shown_url("rediss://h:1/0?ssl_keyfile=/k&ssl_password=pw&Password=pw") == \
        "rediss://h:1/0?ssl_keyfile=/k&ssl_password=***&Password=***"
    assert shown_url("redis+sentinel://u:pw@a:1,b:2/hub/0?sentinel_password=spw") == \
        "redis+sentinel://u:***@a:1,b:2/hub/0?sentinel_password=***"
    assert shown_url("redis://host:6379/0") == "redis://host:6379/0"


def test_a_sentinel_client_asks_for_the_named_primary_with_the_data_nodes_password():
    client = redis_client("redis+sentinel://u:pw@127.0.0.1:1,127.0.0.1:2/hub/3",
                          socket_timeout=1.0, decode_responses=True)
    pool = client.connection_pool
    assert pool.service_name == "hub" and pool.connection_kwargs["db"] == 3
    assert pool.connection_kwargs["password"] == "pw"
    sentinel_kwargs = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert sentinel_kwargs["password"] is None and not sentinel_kwargs.get("decode_responses")
    assert sentinel_kwargs["socket_timeout"] == 1.0


def test_a_cluster_url_names_its_nodes_and_credentials():
    from hivemind_chat_agent.hub.redis_urls import parse_cluster_url
    assert parse_cluster_url("redis+cluster://app:s3cret@10.0.0.5:7000,[::1]:7001") == {
        "nodes": [("10.0.0.5", 7000), ("::1", 7001)], "username": "app", "password": "s3cret",
        "tls": {}}
    assert parse_cluster_url("rediss+cluster://10.0.0.5:7000")["password"] is None


@pytest.mark.parametrize("url", [
    "redis+cluster://",                           # no node
    "redis+cluster://:pw@127.0.0.1/",             # no port
    "redis+cluster://:pw@127.0.0.1:7000/1",       # a database: a cluster has only 0
])
def test_a_malformed_cluster_url_is_a_configuration_error_that_shows_the_form(url):
    from hivemind_chat_agent.hub.redis_urls import parse_cluster_url
    with pytest.raises(ConfigurationError) as raised:
        parse_cluster_url(url)
    assert "redis+cluster://" in str(raised.value) and "HOST:PORT" in str(raised.value)
    assert "pw" not in str(raised.value)


def test_a_cluster_client_connects_to_nothing_until_it_is_used():
    """A cluster down when the hub starts fails the first turns (store_unavailable), not the
    hub's start: RedisCluster's constructor reads the slot map, so it is made at first use."""
    import redis

    from hivemind_chat_agent.errors import ConversationStoreError
    from hivemind_chat_agent.hub.redis_store import RedisStore
    client = redis_client("rediss+cluster://u:pw@127.0.0.1:1,127.0.0.1:2", socket_timeout=0.5)
    assert client._cluster is None and client._options["ssl"] is True
    assert [(n.host, n.port) for n in client._options["startup_nodes"]] == [
        ("127.0.0.1", 1), ("127.0.0.1", 2)]
    store = RedisStore("redis+cluster://:hunter2@127.0.0.1:1", 2, 256, 60)
    with pytest.raises(ConversationStoreError) as failure:
        store.history("s")
    assert "hunter2" not in str(failure.value) and "127.0.0.1:1" in str(failure.value)
    assert not store.ping()
    store.close()
    assert issubclass(redis.exceptions.RedisClusterException, Exception)


# ---- TLS settings in the query (genuine TLS servers: tests/test_redis_tls.py) ----
@pytest.fixture
def ca_file(tmp_path):
    path = tmp_path / "ca.crt"
    path.write_text("not read until a connection is made")
    return str(path)


def test_every_tls_form_carries_the_same_settings_to_its_connections(ca_file):
    from hivemind_chat_agent.hub.redis_urls import parse_cluster_url
    query = (f"ssl_ca_certs={ca_file}&ssl_cert_reqs=required&ssl_check_hostname=false"
             "&ssl_password=k3y&ssl_cert_reqs=none")      # redis-py reads a key's first value
    tls = {"ssl": True, "ssl_ca_certs": ca_file, "ssl_cert_reqs": "required",
           "ssl_check_hostname": False, "ssl_password": "k3y"}
    assert parse_cluster_url(f"rediss+cluster://a:1,b:2?{query}")["tls"] == tls
    assert parse_sentinel_url(f"rediss+sentinel://a:1/hub?{query}&sentinel_password=x")["tls"] \
        == tls
    assert parse_sentinel_url("rediss+sentinel://a:1/hub")["tls"] == {"ssl": True}
    client = redis_client(f"rediss+sentinel://127.0.0.1:1/hub/0?{query}")
    assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == ca_file
    sentinel = client.connection_pool.sentinel_manager.sentinels[0]
    assert sentinel.connection_pool.connection_kwargs["ssl_ca_certs"] == ca_file
    cluster = redis_client(f"rediss+cluster://127.0.0.1:1?{query}")
    assert cluster._options["ssl_ca_certs"] == ca_file
    plain = redis_client(f"rediss://127.0.0.1:1/0?ssl_ca_certs={ca_file}")
    assert plain.connection_pool.connection_kwargs["ssl_ca_certs"] == ca_file


@pytest.mark.parametrize("url, says", [
    ("rediss+cluster://a:1?ssl_ca_certs=/nowhere/ca.crt", "ssl_ca_certs=/nowhere/ca.crt is not"),
    ("rediss://:pw@a:1/0?ssl_certfile=/nowhere/me.crt", "ssl_certfile=/nowhere/me.crt is not"),
    ("redis+sentinel://a:1/hub?ssl_ca_certs={ca}", "rediss+sentinel://"),
    ("redis://:pw@a:1/0?ssl_ca_certs={ca}", "TLS settings but no TLS"),
    ("rediss+cluster://:pw@a:1?ssl_cert_reqs=maybe", "required, optional, none"),
    ("rediss://:pw@a:1/0?ssl_cert_reqs=Required", "required, optional, none"),   # as redis-py
    ("rediss+sentinel://:pw@a:1/hub?ssl_ca_cert={ca}", "not known here: ssl_ca_cert"),
    ("rediss://:pw@a:1/0?ssl_ca_cert={ca}&socket_timeout=2", "not known here: ssl_ca_cert"),
    ("redis+cluster://127.0.0.1:7000?x=1", "not known here: x"),
    ("rediss+sentinel://a:1/hub?password=pw&ssl_password=pw", "not known here: password"),
])
def test_a_tls_setting_that_cannot_work_is_refused_when_the_hub_starts(url, says, ca_file):
    with pytest.raises(ConfigurationError) as raised:
        redis_client(url.format(ca=ca_file))
    assert says in str(raised.value) and "pw" not in str(raised.value)
