# checkout: a multi-stage release build and a small, non-root runtime image.
#   docker build -t checkout .
#   docker run -p 8080:8080 -e DATABASE_URL=postgres://user:pass@db/checkout -e OPENAI_API_KEY=sk-... checkout
# Without DATABASE_URL it keeps receipts in SQLite at /data/checkout.db (mount a volume);
# without OPENAI_API_KEY / OPENAI_BASE_URL it serves the built-in scripted model.
# It listens on 0.0.0.0, so it needs an API key to start (CHECKOUT_AUTH=auto): make one
# on its volume or database first, `docker run ... checkout api-keys create NAME`.
#
# The binary: built here from the sources (BINARY=source, the default), or taken as
# built on a Debian 12 host from target/release/checkout of the build context
# (--build-arg BINARY=prebuilt; scripts/container-check does that, to build and run this
# image in minutes where no registry is reachable).
ARG BINARY=source

FROM rust:1.95-slim-bookworm AS binary-source
WORKDIR /src
# The manifests first, so that a change to the code reuses the layer of built
# dependencies. The benchmark's manifest and a placeholder for its source only complete
# the workspace the lock file names; its code is never built here.
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml bench/Cargo.toml
# The patched dependencies the root manifest names ([patch.crates-io]; vendor/README.md).
COPY vendor vendor
RUN mkdir -p src bench/src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > bench/src/main.rs \
    && cargo build --release --locked --bin checkout \
    && rm -rf src
COPY src src
COPY migrations migrations
# Make cargo see the real sources as newer than the placeholder build.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin checkout \
    && mkdir -p /data

FROM scratch AS binary-prebuilt
# WORKDIR makes the empty /data the runtime stage takes (it has no shell to make one).
WORKDIR /data
COPY target/release/checkout /src/target/release/checkout

FROM binary-${BINARY} AS build

# distroless/cc: glibc, libgcc, CA certificates (for https://api.openai.com), no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/checkout /usr/local/bin/checkout
COPY config/default.toml /etc/checkout/default.toml
COPY --from=build --chown=65532:65532 /data /data
ENV CHECKOUT_CONFIG=/etc/checkout/default.toml \
    CHECKOUT_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/checkout.db \
    CHECKOUT_LOG_FORMAT=json
WORKDIR /data
VOLUME /data
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/checkout"]
