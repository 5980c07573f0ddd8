//go:build !race

package otlphttp

const raceEnabled = false
