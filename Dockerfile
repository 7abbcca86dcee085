# Build a static scopeplane binary, then run it distroless as non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY controllers/ controllers/
COPY internal/ internal/
COPY xds/ xds/
COPY main.go ./
# VERSION is the chart's appVersion (make build passes the same).
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/scopeplane .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/scopeplane /scopeplane
USER 65532:65532
# 18000: xDS (ADS gRPC); 8080: metrics; 8081: /healthz and /readyz.
EXPOSE 18000 8080 8081
ENTRYPOINT ["/scopeplane"]
