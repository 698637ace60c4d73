# raftps's image: the static binary alone. No base image is pulled (the
# binary needs no libc, /etc/passwd, CA certificates or /tmp), so the build
# works offline. Build it with `make image`, which compiles bin/docker/raftps
# (CGO_ENABLED=0) and uses bin/docker as the context: the repository is never
# sent to the daemon.
FROM scratch
COPY raftps /raftps
# An empty directory owned by the unprivileged user: a fresh named volume
# mounted at /data takes its ownership, so the server can write to it.
COPY --chown=65532:65532 data /data
# Likewise for the certificates volume of deploy/docker-compose.yml, which
# its one-shot certs service fills (raftps cert init).
COPY --chown=65532:65532 data /certs
USER 65532:65532
VOLUME /data
# The client API, HTTP (/healthz, /debug/pprof), memberlist gossip (client
# port + 1000, TCP and UDP) and the peer API (client port + 2000: Raft,
# chains, node-to-node calls).
EXPOSE 7001/tcp 7101/tcp 8001/tcp 8001/udp 9001/tcp
ENTRYPOINT ["/raftps"]
CMD ["help"]
