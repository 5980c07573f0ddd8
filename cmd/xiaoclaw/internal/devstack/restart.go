package devstack

import "errors"

// RestartNATS stops the embedded NATS server and starts it again on the
// same address and data directory, as a NATS process restart would. Every
// replica's connection drops and reconnects; JetStream keeps what it
// stored. Not safe while Connect runs.
func (s *Stack) RestartNATS() error {
	if s.nats == nil {
		return errors.New("devstack: RestartNATS needs the embedded NATS server")
	}
	return s.nats.Restart()
}
