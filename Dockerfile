# Builds the module, then runs it in the official redis image at the version the tests run
# on (Redis 7.0.15, as Debian bookworm ships it; both stages are bookworm, so one glibc).
#   docker build -t redis-rl .        (or: docker compose up, see docker-compose.yml)
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends clang libclang-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release -p redis-rl

FROM redis:7.0.15-bookworm
COPY --from=build /src/target/release/libredis_rl.so /usr/local/lib/redis/modules/libredis_rl.so
CMD ["redis-server", "--loadmodule", "/usr/local/lib/redis/modules/libredis_rl.so"]
