package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfileIsGenerated holds the Dockerfile to the recipe: it is what
// go run ./hack/image -dockerfile writes for the chart's appVersion (make
// generate), so the Dockerfile cannot drift from make image's base, user,
// ports or labels without this test failing. test/dockerfile checks that
// what it builds is make image's image.
func TestDockerfileIsGenerated(t *testing.T) {
	chart, err := os.ReadFile("../../charts/scopeplane/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("Chart.yaml names no appVersion")
	}
	want, err := dockerfileOf(options{name: "scopeplane", artifact: artifacts["scopeplane"], version: string(m[1])})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("the Dockerfile is not the recipe's: run make generate (go run ./hack/image -dockerfile -version %s > Dockerfile)\n--- want\n%s", m[1], want)
	}
	if !strings.Contains(want, "FROM scratch") {
		t.Error("the recipe's image stage does not start from an empty base")
	}
}

// A Dockerfile is refused for an image it does not describe, and without
// the version its argument defaults to.
func TestDockerfileRefusals(t *testing.T) {
	if _, err := dockerfileOf(options{name: "scopeplane-demo", artifact: artifacts["scopeplane-demo"], version: "1.0.0"}); err == nil {
		t.Error("a Dockerfile for scopeplane-demo was written")
	}
	if _, err := dockerfileOf(options{name: "scopeplane", artifact: artifacts["scopeplane"]}); err == nil || !strings.Contains(err.Error(), "-version") {
		t.Errorf("no version: %v, want an error naming -version", err)
	}
}
