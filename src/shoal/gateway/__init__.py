"""HTTP gateways over the client: an S3-compatible endpoint (shoal.gateway.s3) and a
WebHDFS-compatible endpoint (shoal.gateway.webhdfs). Built on the client only."""
