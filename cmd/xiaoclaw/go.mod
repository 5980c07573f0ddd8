module github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw

go 1.26.0

require (
	github.com/xiaoclaw/xiaoclaw v0.0.0
	github.com/xiaoclaw/xiaoclaw/services/devicehub v0.0.0
	github.com/xiaoclaw/xiaoclaw/services/gateway v0.0.0
	github.com/xiaoclaw/xiaoclaw/services/shim v0.0.0
)

replace (
	github.com/xiaoclaw/xiaoclaw => ../..
	github.com/xiaoclaw/xiaoclaw/services/devicehub => ../../services/devicehub
	github.com/xiaoclaw/xiaoclaw/services/gateway => ../../services/gateway
	github.com/xiaoclaw/xiaoclaw/services/shim => ../../services/shim
)
