# Sluice router image: a multi-stage release build (docker-compose.yml runs two routers from it
# in --configdb mode in front of a MongoDB 8.0 sharded cluster).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY examples ./examples
COPY configs ./configs
RUN cargo build --release --locked --bin sluice

FROM debian:bookworm-slim
# The time zone database: the date operators read Olson zones (Europe/Paris) from it.
RUN apt-get update && apt-get install -y --no-install-recommends tzdata \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 sluice
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
USER sluice
EXPOSE 27017 9216
ENTRYPOINT ["/usr/local/bin/sluice"]
