package policy

// GlobMatchForTest exposes globMatch to the external tests.
var GlobMatchForTest = globMatch
