module github.com/xiaoclaw/xiaoclaw/services/gateway

go 1.26.0

require github.com/xiaoclaw/xiaoclaw v0.0.0

replace github.com/xiaoclaw/xiaoclaw => ../..
