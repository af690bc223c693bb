"""Map: registered devices at their sites and alerted devices, coloured by their worst alert;
devices silent now ringed in purple and labelled with the time of their last reading.

The basemap is Carto's (no API key, needs the internet). Under the devices the map always draws
the country borders of Natural Earth 1:110m, bundled with the package, so that it reads offline
and with ``IOT_DASH_MAP_STYLE=none`` too. Only devices with standing alerts, or silent now, are
labelled.
"""

from __future__ import annotations

import json
import logging
import math
from importlib import resources
from typing import Any

import polars as pl
import pydeck as pdk
import streamlit as st

from dashboard import data, reads, ui
from infra import lake

log = logging.getLogger(__name__)

# RGBA per worst severity; devices without alerts are grey.
COLORS = {
    "low": [242, 201, 76, 220],
    "medium": [242, 153, 74, 220],
    "high": [235, 87, 87, 230],
    "critical": [139, 0, 0, 240],
}
NO_ALERT = [120, 130, 140, 160]
# The outline of a device: a thick purple ring when it is silent now, else a thin white line.
SILENT_RING, SILENT_RING_PX = [111, 45, 189, 255], 4
OUTLINE, OUTLINE_PX = [255, 255, 255, 200], 1
BORDERS = "countries-110m.geojson"

settings = ui.get_settings()
st.title("Map")


@st.cache_resource(show_spinner=False)
def country_borders() -> dict[str, Any]:
    """The bundled country outlines (GeoJSON), read once per server: they never change."""
    text = (resources.files("dashboard") / "assets" / BORDERS).read_text(encoding="utf-8")
    borders: dict[str, Any] = json.loads(text)
    return borders


def fit_view(points: pl.DataFrame) -> pdk.ViewState:
    """Centre and zoom so that every point is on the map."""
    lat_min, lat_max = float(points["lat"].min()), float(points["lat"].max())  # type: ignore[arg-type]
    lon_min, lon_max = float(points["lon"].min()), float(points["lon"].max())  # type: ignore[arg-type]
    # Web-Mercator zoom z shows about 360 / 2**z degrees across the map's width.
    span = max(lon_max - lon_min, (lat_max - lat_min) * 1.5, 0.01)
    zoom = max(0.0, min(12.0, math.log2(360.0 / (span * 1.6))))
    return pdk.ViewState(
        latitude=(lat_min + lat_max) / 2, longitude=(lon_min + lon_max) / 2, zoom=zoom
    )


def deck(points: pl.DataFrame) -> pdk.Deck:
    silent = pl.col("silence").is_not_null()
    colors = pl.DataFrame(
        {
            "worst_severity": list(COLORS),
            **{
                ch: [rgba[i] for rgba in COLORS.values()]
                for i, ch in enumerate(("r", "g", "b", "a"))
            },
        }
    )
    # No timestamps in the layers' data: the text of ``silence`` says when.
    shown = points.drop("silent_since", strict=False).join(colors, on="worst_severity", how="left")
    shown = shown.with_columns(
        *(pl.col(ch).fill_null(NO_ALERT[i]) for i, ch in enumerate(("r", "g", "b", "a"))),
        (3000 + 2500 * pl.col("alerts").clip(0, 10)).alias("radius"),
        pl.col("worst_severity").fill_null("none"),
        pl.col("device_type").fill_null("unregistered"),
        *(
            pl.when(silent).then(SILENT_RING[i]).otherwise(OUTLINE[i]).alias(f"line_{ch}")
            for i, ch in enumerate(("r", "g", "b", "a"))
        ),
        pl.when(silent).then(SILENT_RING_PX).otherwise(OUTLINE_PX).alias("line_px"),
        # Tooltip and label text: "; silent since 14:05 UTC" for a device silent now.
        pl.when(silent).then("; " + pl.col("silence")).otherwise(pl.lit("")).alias("silent_note"),
        pl.when(silent)
        .then(pl.format("{} ({})", "device_id", "silence"))
        .otherwise(pl.col("device_id"))
        .alias("label"),
    )
    layer = pdk.Layer(
        "ScatterplotLayer",
        data=shown.to_pandas(),
        get_position=["lon", "lat"],
        get_fill_color="[r, g, b, a]",
        get_radius="radius",
        radius_min_pixels=7,
        radius_max_pixels=40,
        stroked=True,
        get_line_color="[line_r, line_g, line_b, line_a]",
        get_line_width="line_px",
        line_width_units="pixels",
        pickable=True,
    )
    carto = settings.map_style == "carto"
    borders = pdk.Layer(
        "GeoJsonLayer",
        data=country_borders(),
        stroked=True,
        # Without a basemap, land is shaded so that coasts read; on Carto's, only the lines.
        filled=not carto,
        get_fill_color=[222, 226, 216, 255],
        get_line_color=[150, 158, 166, 220],
        line_width_min_pixels=1,
    )
    # A label per device would bury the map: only devices with standing alerts, or silent now,
    # are named.
    labels = pdk.Layer(
        "TextLayer",
        data=shown.filter((pl.col("alerts") > 0) | silent)
        .select("device_id", "label", "lon", "lat")
        .to_pandas(),
        get_position=["lon", "lat"],
        get_text="label",
        get_size=12,
        get_color=[40, 40, 40, 220],
        get_pixel_offset=[0, -18],
    )
    view = fit_view(shown)
    return pdk.Deck(
        layers=[borders, layer, labels],
        initial_view_state=view,
        map_provider="carto" if carto else None,
        map_style=pdk.map_styles.CARTO_LIGHT if carto else None,
        # Text tooltips: field values are never interpreted as HTML.
        tooltip={
            "text": "{device_id} ({device_type})\n{alerts} alerts, worst: {worst_severity}"
            "{silent_note}"
        },
    )


def fleet_map() -> None:
    span = ui.time_window()
    devices = reads.devices(settings)
    alerts = reads.alerts(settings, span, columns=["device_id", "severity"])
    unregistered = sorted(
        set(alerts["device_id"].drop_nulls().to_list()) - set(devices["device_id"].to_list())
    )
    positions = reads.last_positions(settings, unregistered, span)
    silent = reads.silent_devices(settings)
    points = data.map_points(devices, alerts, positions, silent, data.utcnow())
    cols = st.columns(5)
    cols[0].metric("Devices on the map", points.height)
    cols[1].metric("With alerts", points.filter(pl.col("alerts") > 0).height)
    cols[2].metric("Not in the registry", points.filter(~pl.col("registered")).height)
    cols[3].metric("Alerts in range", alerts.height)
    cols[4].metric(
        "Silent now",
        silent.height,
        help="Registered devices not heard from since a device_silent alert, whatever the range",
    )
    ui.updated_caption(settings)
    if points.is_empty():
        ui.empty_state("devices with a known position", lake.DEVICES)
        return
    st.pydeck_chart(deck(points), height=520)
    st.caption(
        "Grey: no alert in the range; yellow, orange, red, dark red: worst alert low, medium, "
        "high, critical; size grows with the number of alerts, and devices with alerts are "
        'named. Purple ring: silent now, labelled with its last reading ("silent since"). '
        "Registered devices are drawn at their site, unregistered ones at their last reported "
        "position."
    )
    table = points.drop("silent_since").with_columns(pl.col("silence").fill_null(""))
    ui.show_table(table.sort(["alerts", "device_id"], descending=[True, False]), height=260)


ui.refreshing(settings, fleet_map)
