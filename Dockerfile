# Build a static scopeplane binary, then run it distroless as non-root. For
# those who build with a container engine; `make image` builds the same image
# (on a scratch-style base) without one.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY controllers/ controllers/
COPY internal/ internal/
COPY xds/ xds/
# Every Go file of package main (a new one needs no new line here; the
# _test.go files come along and go build ignores them).
COPY *.go ./
COPY charts/scopeplane/Chart.yaml charts/scopeplane/
# VERSION defaults to the chart's appVersion, as in make build and make image.
ARG VERSION=
RUN v="${VERSION:-$(awk '/^appVersion:/ { gsub(/"/, "", $2); print $2 }' charts/scopeplane/Chart.yaml)}" && \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X main.version=${v}" -o /out/scopeplane .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/scopeplane /scopeplane
USER 65532:65532
# 18000: xDS (ADS gRPC); 8080: metrics; 8081: /healthz and /readyz.
EXPOSE 18000 8080 8081
ENTRYPOINT ["/scopeplane"]
