"""Writes specserve/data/bench/agent.json, the agent-loop workload of `specserve bench agent`: a catalogue of
invented tools (schemas with bounded strings, so every call fits the bench's token limit) and 12 invented
conversations, each offering three tools; the first user turn asks for a call (tool_choice required), the
second names the function to call.  Run from the repository root: python experiments/agent_workload.py"""
import json
S = lambda n, **kw: {"type": "string", "maxLength": n, **kw}
tools = {
 "get_weather": {"description": "Get the weather forecast for a city.", "parameters": {"type": "object", "properties": {
     "city": S(40), "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
     "required": ["city"], "additionalProperties": False}},
 "search_web": {"description": "Search the web and return the top results.", "parameters": {"type": "object", "properties": {
     "query": S(60), "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["query"], "additionalProperties": False}},
 "get_order_status": {"description": "Look up the status of a customer's order by its id.", "parameters": {"type": "object", "properties": {
     "order_id": S(20)}, "required": ["order_id"], "additionalProperties": False}},
 "send_email": {"description": "Send an email.", "parameters": {"type": "object", "properties": {
     "to": S(40), "subject": S(40), "body": S(80)}, "required": ["to", "subject", "body"], "additionalProperties": False}},
 "create_event": {"description": "Add an event to the user's calendar.", "parameters": {"type": "object", "properties": {
     "title": S(50), "date": dict(type="string", pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), "time": dict(type="string", pattern="^[0-9]{2}:[0-9]{2}$"),
     "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480}}, "required": ["title", "date"], "additionalProperties": False}},
 "convert_currency": {"description": "Convert an amount of money between currencies.", "parameters": {"type": "object", "properties": {
     "amount": {"type": "number", "minimum": 0, "maximum": 1000000}, "from_currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
     "to_currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "CHF"]}}, "required": ["amount", "from_currency", "to_currency"], "additionalProperties": False}},
 "calculate": {"description": "Evaluate an arithmetic expression.", "parameters": {"type": "object", "properties": {
     "expression": S(60)}, "required": ["expression"], "additionalProperties": False}},
 "lookup_contact": {"description": "Find a contact's email address and phone number by name.", "parameters": {"type": "object", "properties": {
     "name": S(40)}, "required": ["name"], "additionalProperties": False}},
}
R = "required"
convs = [
 (["get_weather", "search_web", "send_email"], [("What's the weather going to be in Lisbon for the next three days? Use celsius.", R), ("Thanks. Email that forecast to maria@example.com with the subject 'Lisbon weather'.", "send_email")]),
 (["get_order_status", "send_email", "lookup_contact"], [("Where is my order NW-204871? It was supposed to arrive yesterday.", R), ("Please email the status to my colleague Tom Becker, tom.becker@example.com.", "send_email")]),
 (["convert_currency", "calculate", "search_web"], [("How much is 250 euros in US dollars?", R), ("And what is that amount divided by 4, per person?", "calculate")]),
 (["create_event", "get_weather", "lookup_contact"], [("Put a dentist appointment in my calendar for 2026-03-14 at 09:30, 45 minutes.", R), ("What will the weather be in Zurich that day?", "get_weather")]),
 (["search_web", "get_weather", "calculate"], [("Search the web for the opening hours of the Rijksmuseum in Amsterdam.", R), ("Now check the weather in Amsterdam for tomorrow, in celsius.", "get_weather")]),
 (["lookup_contact", "send_email", "create_event"], [("Find the email address of Ana Souza.", R), ("Email Ana Souza to invite her to lunch on Friday, subject 'Lunch on Friday'.", "send_email")]),
 (["get_order_status", "convert_currency", "send_email"], [("Can you check order NW-118230 for me?", R), ("The refund was 89.90 GBP. How much is that in euros?", "convert_currency")]),
 (["calculate", "convert_currency", "search_web"], [("What is 17.5 percent of 1240?", R), ("Convert 1240 Swiss francs to euros.", "convert_currency")]),
 (["get_weather", "create_event", "send_email"], [("Is it going to rain in Oslo this weekend? Give me two days in celsius.", R), ("Add a hiking trip to my calendar on 2026-05-02 at 08:00 for 240 minutes.", "create_event")]),
 (["search_web", "lookup_contact", "send_email"], [("Look up the latest news about the Rust programming language, five results.", R), ("Send a summary to dev-team@example.com with the subject 'Rust news'.", "send_email")]),
 (["get_order_status", "get_weather", "search_web"], [("My order NW-330914 still says processing. What's going on?", R), ("Also, what's the weather in Madrid today in celsius? The courier is there.", "get_weather")]),
 (["create_event", "lookup_contact", "calculate"], [("Schedule a project review on 2026-02-20 at 14:00 for 60 minutes.", R), ("Who is Priya Natarajan? I need her phone number for the review.", "lookup_contact")]),
]
doc = {"tools": {n: {"type": "function", "function": {"name": n, **t}} for n, t in tools.items()},
       "conversations": [{"id": f"agent-{i:02d}", "system": "You are a helpful assistant that uses tools to answer.",
                          "tools": ts, "turns": [{"user": u, "tool_choice": c} for u, c in turns]} for i, (ts, turns) in enumerate(convs)]}
json.dump(doc, open("specserve/data/bench/agent.json", "w"), indent=1)
