"""The URL classification of issue 27: what a tenant may make the operator dial, in every spelling a client reads."""

from __future__ import annotations

import ipaddress

import pytest

from controller.api.urls import address_problem, ip_of, under_prefix, url_problem

HOSTILE = {
    "http://127.0.0.1:5000/": "loopback",
    "http://127.1/": "loopback",
    "http://2130706433/": "loopback",  # decimal
    "http://017700000001/": "loopback",  # octal
    "http://0x7f.1/": "loopback",  # hex, short form
    "http://0x7f000001/": "loopback",
    "http://0177.0.0.01/": "loopback",
    "http://[::1]/": "loopback",
    "http://[::ffff:127.0.0.1]/": "loopback",  # IPv4-mapped
    "http://[::ffff:7f00:1]/": "loopback",
    "http://[2002:7f00:1::]/": "loopback",  # 6to4
    "http://[64:ff9b::7f00:1]/": "loopback",  # NAT64
    "http://localhost/": "this host",
    "http://LOCALHOST./": "this host",
    "http://api.localhost/": "this host",
    "http://ｌｏｃａｌｈｏｓｔ/": "this host",  # fullwidth: IDNA maps it
    "http://１２７.０.０.１/": "loopback",
    "http://169.254.169.254/latest/meta-data/": "metadata",
    "http://[fd00:ec2::254]/": "metadata",
    "http://metadata.google.internal/computeMetadata/v1/": "the cloud",
    "http://metadata/": "the cloud",
    "http://169.254.1.1/": "link-local",
    "http://[fe80::1]/": "link-local",
    "http://[fe80::1%25eth0]/": "escapes",
    "http://10.0.0.1/": "private",
    "http://172.16.5.4/": "private",
    "http://192.168.1.1/": "private",
    "http://100.64.0.1/": "private",
    "http://[fc00::1]/": "private",
    "http://0.0.0.0/": "unspecified",
    "http://0/": "unspecified",
    "http://[::]/": "unspecified",
    "http://224.0.0.1/": "multicast",
    "http://kubernetes.default.svc/api": "the cluster",
    "http://kubernetes.default.svc.cluster.local/": "the cluster",
    "http://kubernetes.default/": "the cluster",
    "http://kubernetes/": "the cluster",
    "http://mlflow.team-b.svc/": "the cluster",
    "http://mlflow/": "single-label",
    "https://mlflow.example.256/": "neither",
    "http://1.2.3.256/": "neither",
    "http://user:pass@example.com/": "login",
    "http://example.com@127.0.0.1/": "login",
    "ftp://example.com/": "not http(s)",
    "file:///etc/passwd": "not http(s)",
    "gopher://example.com/": "not http(s)",
    "http://example.com\\@127.0.0.1/": "backslash",
    "http://%31%32%37.0.0.1/": "escapes",
    "http://example.com:port/": "not a URL",
    "http:///path": "no valid host",
    "http://a..b/": "no valid host",
}


@pytest.mark.parametrize(("url", "says"), HOSTILE.items())
def test_hostile_urls_are_refused_whatever_their_spelling(url: str, says: str) -> None:
    assert says in url_problem(url)


@pytest.mark.parametrize("url", ["https://mlflow.example.com/", "http://93.184.216.34:8080/x?y=1",
                                 "https://EXAMPLE.com./api", "https://[2606:4700::1111]/", "https://bücher.example/"])
def test_public_servers_are_fine(url: str) -> None:
    assert url_problem(url) == ""


def test_the_api_servers_own_address_is_refused_even_when_public() -> None:
    assert "API server" in url_problem("https://203.0.114.7:443/", denied_hosts=("203.0.114.7",))


@pytest.mark.parametrize(("host", "address"), [("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
                                               ("10.1", "10.0.0.1"), ("192.168.257", "192.168.1.1"),
                                               ("0300.0250.1.1", "192.168.1.1"), ("example.com", None),
                                               ("4294967296", None), ("1.2.3.4.5", None)])
def test_ipv4_in_every_form_inet_aton_reads(host: str, address: str | None) -> None:
    assert ip_of(host) == (None if address is None else ipaddress.ip_address(address))


def test_resolved_addresses_are_judged_alike() -> None:
    assert "private" in address_problem(ipaddress.ip_address("10.96.0.1"))
    assert address_problem(ipaddress.ip_address("8.8.8.8")) == ""


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://mlflow.mlflow.svc:5000", True), ("http://mlflow.mlflow.svc:5000/", True),
    ("http://mlflow.mlflow.svc:5000/api/x", True), ("HTTP://MLFLOW.mlflow.svc:5000/", True),
    ("http://mlflow.mlflow.svc:5001/", False), ("https://mlflow.mlflow.svc:5000/", False),
    ("http://mlflow.mlflow.svc.evil.com:5000/", False), ("http://x@mlflow.mlflow.svc:5000/", False),
])
def test_an_admins_prefix_admits_its_origin_only(url: str, allowed: bool) -> None:
    assert under_prefix(url, ["http://mlflow.mlflow.svc:5000"]) is allowed
    assert under_prefix("http://relay.svc/hooks/ab", ["http://relay.svc/hooks/a"]) is False
    assert under_prefix("http://relay.svc:80/hooks/a/1", ["http://relay.svc/hooks/a"]) is True
