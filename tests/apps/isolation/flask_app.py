"""A Flask app (served by gunicorn in its tenant's sandbox): ``GET /`` answers what it sees (view.py)."""

from __future__ import annotations

from flask import Flask, jsonify
from view import observe

app = Flask(__name__)


@app.get("/")
def index():
    return jsonify(observe("flask"))
