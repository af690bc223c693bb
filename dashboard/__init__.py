"""The Streamlit dashboard for fraud analysts: reads the Delta lake with ``deltalake``, no JVM."""
