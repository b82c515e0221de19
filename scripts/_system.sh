# Sourced by scripts/test: system packages the tests use, installed when missing.
# kcat is a real Kafka client (librdkafka) the Kafka-endpoint tests run against.
if ! command -v kcat >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test: installing kcat (Debian package) for the Kafka interop tests" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat; } \
            >/dev/null 2>&1 || echo "scripts/test: could not install kcat; its tests will skip" >&2
    else
        echo "scripts/test: kcat not found and not root; kcat tests will skip" >&2
    fi
fi
# chromium is the real browser the console's tests drive (through Playwright).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test: installing chromium (Debian package) for the console's browser tests" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
            >/dev/null 2>&1 || echo "scripts/test: could not install chromium; its tests will skip" >&2
    else
        echo "scripts/test: chromium not found and not root; the browser tests will skip" >&2
    fi
fi
# etcd is the consensus store coordinator failover runs on (DESIGN §3 "Coordinator failover").
if ! command -v etcd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test: installing etcd-server (Debian package) for the failover tests" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; } \
            >/dev/null 2>&1 || echo "scripts/test: could not install etcd-server; its tests will skip" >&2
    else
        echo "scripts/test: etcd not found and not root; the failover tests will skip" >&2
    fi
fi
