# scafo-edge image: a static binary on distroless, run as a non-root user that
# still binds 80 and 443.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t scafo-edge .
#   docker buildx build --platform linux/arm64 -t scafo-edge:arm64 .   # for arm64 boxes
#
# The build needs BuildKit: Docker 23 or later with the buildx plugin, or an
# older engine with DOCKER_BUILDKIT=1. The legacy builder would drop the file
# capability set below and leave an image that cannot bind 80; the cache
# mount of the go build makes it refuse this file instead. There is no
# `# syntax=` line: the engine's own Dockerfile frontend (Docker 20.10's and
# later) reads every instruction here, so a build pulls no frontend image,
# only the two base images.
#
# e2e/dockerfile_test.go and e2e/image_test.go build the binary with this
# file's builder flags and check this file's user, volume, ports and
# healthcheck against the flags' defaults: change them together.
# deploy/image-check.sh builds this file on a real Docker engine for
# linux/amd64 and linux/arm64, checks both images' platform and binary, and
# runs the native one (user, capability, volume mode, health, stop, upgrade).

ARG GO_VERSION=1.26

# The builder runs on the build machine's own platform whatever the target
# (BUILDPLATFORM), and Go cross-compiles for the target (TARGETOS and
# TARGETARCH, which BuildKit sets from --platform): an arm64 image builds on
# an amd64 machine, and the other way round, at native speed and without
# emulation. Nothing in the final stage runs at build time, so it needs no
# emulator either.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
# setcap lives in libcap2-bin; the final stage has no shell to run it in.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
# The state directory, made here where a shell can set its owner and mode and
# copied into the final stage as an entry of /out/varlib/ (see there).
RUN install -d -m 0700 -o 65532 -g 65532 /out/varlib/scafo-edge
WORKDIR /src
# Modules first, so editing a source file does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# Set by BuildKit from --platform (by default the builder's own): linux, and
# amd64 or arm64.
ARG TARGETOS
ARG TARGETARCH
ENV CGO_ENABLED=0
# The file capability lets the non-root user bind 80 and 443. It is set here
# because the final stage has no setcap; it is an extended attribute of the
# file, set alike on a binary of either architecture. BuildKit (Docker's
# builder since 23.0) keeps it through COPY --from, the legacy builder drops
# it. The cache mount
# keeps Go's build cache between builds (a source change recompiles only what
# it touches) and is BuildKit-only: the legacy builder stops here with "the
# --mount option requires BuildKit" rather than build an image without the
# capability.
RUN --mount=type=cache,target=/root/.cache/go-build \
    export GOOS=$TARGETOS GOARCH=$TARGETARCH \
 && go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/scafo-edge ./cmd/scafo-edge \
 && setcap cap_net_bind_service=+ep /out/scafo-edge

# distroless static: CA certificates, /etc/passwd with nonroot (65532), tzdata,
# and nothing else; no shell, so the healthcheck is the binary itself.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/scafo-edge /scafo-edge
# A named volume starts as a copy of this directory, so it comes up owned by
# the nonroot user (65532) and mode 0700 (it holds certificate keys). The
# directory is copied as an entry of /out/varlib/, which keeps the owner and
# mode it was made with: copied as the destination itself (COPY --chown
# --chmod=0700 dir /var/lib/scafo-edge), BuildKit before
# tonistiigi/fsutil#228 (moby/buildkit#4945), which engines in the field still
# run, creates it 0755 whatever --chmod says.
COPY --from=build /out/varlib/ /var/lib/
USER nonroot:nonroot
VOLUME /var/lib/scafo-edge
# 80: HTTP and ACME HTTP-01; 443: HTTPS (443/udp: HTTP/3, planned);
# 9180: admin (/metrics, /healthz, /readyz).
EXPOSE 80 443 443/udp 9180
# health reads SCAFO_EDGE_ADMIN_ADDR, like serve, so moving the admin
# listener by environment moves the probe with it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 CMD ["/scafo-edge", "health"]
# SIGTERM (docker stop) drains in-flight requests for --shutdown-timeout
# (30s); give docker stop a longer grace period than that (--time 35).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/scafo-edge"]
CMD ["serve"]
