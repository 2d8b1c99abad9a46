# syntax=docker/dockerfile:1
#
# scafo-edge image: a static binary on distroless, run as a non-root user that
# still binds 80 and 443.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t scafo-edge .
#
# cmd/scafo-edge/packaging_test.go builds the binary with this file's builder
# flags and checks this file's user, volume, ports and healthcheck against the
# flags' defaults: change both together.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
# setcap lives in libcap2-bin; the final stage has no shell to run it in.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first, so editing a source file does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ENV CGO_ENABLED=0
# The file capability lets the non-root user bind 80 and 443. It is set here
# because the final stage has no setcap; BuildKit (Docker's builder since 23.0)
# keeps it through COPY --from, the legacy builder drops it.
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/scafo-edge ./cmd/scafo-edge \
 && setcap cap_net_bind_service=+ep /out/scafo-edge \
 && mkdir -m 0700 /out/state

# distroless static: CA certificates, /etc/passwd with nonroot (65532), tzdata,
# and nothing else; no shell, so the healthcheck is the binary itself.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/scafo-edge /scafo-edge
# A named volume starts as a copy of this directory, so it comes up owned by
# the nonroot user (65532) and mode 0700 (it holds certificate keys).
COPY --from=build --chown=65532:65532 --chmod=0700 /out/state /var/lib/scafo-edge
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
