//go:build race

package trainer

// raceDetector: this test binary was built with -race.
const raceDetector = true
