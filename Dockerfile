# The project image: every Python service of docker-compose.yml runs from it (the Spark master,
# worker and pipeline driver, the trainer, the simulator, the dashboard and the MLflow server).
#   docker build -t iotfraud:local .
#   docker run --rm iotfraud:local config
FROM python:3.11-slim-bookworm

# The Kafka source and Delta for spark-submit --packages: the versions pinned in infra/jars.py.
ARG SPARK_PACKAGES=org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0,io.delta:delta-spark_4.2_2.13:4.4.0

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYSPARK_PYTHON=/usr/local/bin/python3 \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python3 \
    IOT_STACK_CACHE_DIR=/opt/iotfraud/cache \
    IOT_STACK_STATE_DIR=/home/iot/.iotfraud

# Java 17 for Spark; the man folder works around the JRE's post-install script on slim images.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# A non-root user; the folders that named volumes are mounted on belong to it (a new volume takes
# the owner of the folder it is first mounted on).
RUN useradd --create-home --uid 1000 --shell /bin/bash iot \
    && mkdir -p /data/lake /data/checkpoints /mlflow/artifacts /opt/iotfraud/cache /opt/iotfraud/ivy \
    && chown -R iot:iot /data /mlflow /opt/iotfraud

WORKDIR /app
COPY . /app
RUN pip install "/app[all]"

USER iot
WORKDIR /home/iot
# Resolve the jars once at build time, so containers start without Maven Central: the connector
# bundle for sessions that resolve their own jars (the trainer), and spark-submit's Ivy cache for
# --packages (the pipeline passes --conf spark.jars.ivy=/opt/iotfraud/ivy). The second command
# also proves the spark-submit entry point starts: it prints the pipeline's usage and exits 0.
RUN python -c "from infra.jars import spark_connector_jars; from infra.settings import StackSettings; print(len(spark_connector_jars(StackSettings().cache_dir)), 'connector jars')" \
    && spark-submit --packages "$SPARK_PACKAGES" \
        --conf spark.jars.excludes=org.apache.hadoop:hadoop-client-runtime,org.apache.hadoop:hadoop-client-api \
        --conf spark.jars.ivy=/opt/iotfraud/ivy \
        /app/deploy/submit_pipeline.py --help

EXPOSE 5000 7077 8080 8081 8501
ENTRYPOINT ["iotfraud"]
CMD ["--help"]
