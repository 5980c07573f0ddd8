module github.com/xiaoclaw/xiaoclaw/services/devicehub

go 1.26.0

require github.com/xiaoclaw/xiaoclaw v0.0.0

replace github.com/xiaoclaw/xiaoclaw => ../..
