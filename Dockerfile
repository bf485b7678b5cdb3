# The watermark generator (broker-ext serve) as a container, beside the official Pulsar image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY watermark_core ./watermark_core
COPY pulsar_access ./pulsar_access
COPY broker_ext ./broker_ext
COPY producer ./producer
COPY consumer ./consumer
COPY spark_sink ./spark_sink
RUN pip install --no-cache-dir .
ENV PULSAR_SERVICE_URL=pulsar://pulsar:6650 \
    PULSAR_ADMIN_URL=http://pulsar:8080
ENTRYPOINT ["broker-ext"]
CMD ["serve"]
