package chart_test

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/server"
)

// TestLimitsAreTheServerDefaults keeps xds.limits in values.yaml equal to
// server.DefaultOptions: the chart renders every limit as a flag, so a
// default changed in one place only would silently not apply to releases.
func TestLimitsAreTheServerDefaults(t *testing.T) {
	var values struct {
		XDS struct {
			Limits struct {
				MaxRequestBytes         int     `json:"maxRequestBytes"`
				MaxNamesPerRequest      int     `json:"maxNamesPerRequest"`
				ExtraNamesPerType       int     `json:"extraNamesPerType"`
				MaxStreamsPerConnection int     `json:"maxStreamsPerConnection"`
				MaxStreamsPerClient     int     `json:"maxStreamsPerClient"`
				FirstRequestTimeout     string  `json:"firstRequestTimeout"`
				MaxNodeBytes            int     `json:"maxNodeBytes"`
				MaxNodeIDBytes          int     `json:"maxNodeIDBytes"`
				NewStreamsPerSecond     float64 `json:"newStreamsPerSecond"`
				NewStreamsBurst         int     `json:"newStreamsBurst"`
				NewConnectionsPerSecond float64 `json:"newConnectionsPerSecond"`
				NewConnectionsBurst     int     `json:"newConnectionsBurst"`
				NewConnPerPeerPerSecond float64 `json:"newConnectionsPerPeerPerSecond"`
				NewConnPerPeerBurst     int     `json:"newConnectionsPerPeerBurst"`
				MaxConnections          int     `json:"maxConnections"`
				MaxConnectionsPerPeer   int     `json:"maxConnectionsPerPeer"`
				IPv6PrefixLength        int     `json:"ipv6PrefixLength"`
				MaxConnectionIdle       string  `json:"maxConnectionIdle"`
				HandshakeTimeout        string  `json:"handshakeTimeout"`
				MaxHeaderListBytes      int     `json:"maxHeaderListBytes"`
				UnauthPerPeerPerSecond  float64 `json:"unauthenticatedStreamsPerPeerPerSecond"`
				UnauthPerPeerBurst      int     `json:"unauthenticatedStreamsPerPeerBurst"`
				SendTimeout             string  `json:"sendTimeout"`
				NACKsPerSecond          float64 `json:"nacksPerSecond"`
				NACKBurst               int     `json:"nackBurst"`
				MaxConnectionAge        string  `json:"maxConnectionAge"`
				MaxConnectionAgeGrace   string  `json:"maxConnectionAgeGrace"`
			} `json:"limits"`
		} `json:"xds"`
	}
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(chartDir, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	l := values.XDS.Limits
	duration := func(field, v string) time.Duration {
		t.Helper()
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("xds.limits.%s: %v", field, err)
		}
		return d
	}
	timeout := duration("firstRequestTimeout", l.FirstRequestTimeout)
	sendTimeout := duration("sendTimeout", l.SendTimeout)
	maxAge := duration("maxConnectionAge", l.MaxConnectionAge)
	maxAgeGrace := duration("maxConnectionAgeGrace", l.MaxConnectionAgeGrace)
	got := server.Options{
		MaxRequestBytes: l.MaxRequestBytes, MaxNamesPerRequest: l.MaxNamesPerRequest, ExtraNamesPerType: l.ExtraNamesPerType,
		MaxStreamsPerConnection: l.MaxStreamsPerConnection, MaxStreamsPerClient: l.MaxStreamsPerClient, FirstRequestTimeout: timeout,
		MaxNodeBytes: l.MaxNodeBytes, MaxNodeIDBytes: l.MaxNodeIDBytes,
		NewStreamsPerSecond: l.NewStreamsPerSecond, NewStreamsBurst: l.NewStreamsBurst,
		NewConnectionsPerSecond: l.NewConnectionsPerSecond, NewConnectionsBurst: l.NewConnectionsBurst,
		NewConnectionsPerPeerPerSecond: l.NewConnPerPeerPerSecond, NewConnectionsPerPeerBurst: l.NewConnPerPeerBurst,
		MaxConnections: l.MaxConnections, MaxConnectionsPerPeer: l.MaxConnectionsPerPeer, IPv6PrefixLength: l.IPv6PrefixLength,
		MaxConnectionIdle: duration("maxConnectionIdle", l.MaxConnectionIdle), HandshakeTimeout: duration("handshakeTimeout", l.HandshakeTimeout),
		MaxHeaderListBytes:                     l.MaxHeaderListBytes,
		UnauthenticatedStreamsPerPeerPerSecond: l.UnauthPerPeerPerSecond, UnauthenticatedStreamsPerPeerBurst: l.UnauthPerPeerBurst,
		SendTimeout: sendTimeout, NACKsPerSecond: l.NACKsPerSecond, NACKBurst: l.NACKBurst,
		MaxConnectionAge: maxAge, MaxConnectionAgeGrace: maxAgeGrace,
	}
	if !reflect.DeepEqual(got, server.DefaultOptions) { // Options holds slices (the shards' addresses): not comparable with !=
		t.Errorf("xds.limits in values.yaml:\n %+v\nserver.DefaultOptions:\n %+v", got, server.DefaultOptions)
	}
}
