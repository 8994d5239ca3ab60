"""Writes specserve/data/bench/structured.jsonl: the schema workload (tool calls and extraction).

Every request, tool and record below was written for specserve (invented names, places, products);
run ``python experiments/structured_workload.py`` to rewrite the file from this source.
"""
import json
from pathlib import Path


def s(n):      # a bounded string: every answer ends within the bench's token budget
    return {"type": "string", "maxLength": n}


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": required or list(props), "additionalProperties": False}


def call(name, args):
    return obj({"name": {"const": name}, "arguments": obj(args)})


TOOLS = {
    "get_weather": call("get_weather", {"city": s(40), "unit": {"enum": ["celsius", "fahrenheit"]},
                                        "days": {"type": "integer", "minimum": 1, "maximum": 14}}),
    "book_table": call("book_table", {"restaurant": s(40), "date": {"type": "string", "pattern": "^2027-[01][0-9]-[0-3][0-9]$"},
                                      "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                                      "guests": {"type": "integer", "minimum": 1, "maximum": 20}}),
    "send_email": call("send_email", {"to": s(60), "subject": s(60), "body": s(160)}),
    "search_products": call("search_products", {"query": s(60), "max_price": {"type": "number", "minimum": 0, "maximum": 100000},
                                                "category": {"enum": ["books", "electronics", "garden", "kitchen", "toys"]}}),
    "create_event": call("create_event", {"title": s(60), "start": {"type": "string", "pattern": "^2027-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]$"},
                                          "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 600},
                                          "attendees": {"type": "array", "items": s(40), "maxItems": 5}}),
    "convert_currency": call("convert_currency", {"amount": {"type": "number", "minimum": 0, "maximum": 1e9},
                                                  "from": {"enum": ["EUR", "USD", "GBP", "JPY", "CHF"]},
                                                  "to": {"enum": ["EUR", "USD", "GBP", "JPY", "CHF"]}}),
}

TOOL_REQUESTS = [
    ("What will the weather be like in Lisbon for the next three days? Use celsius.", ["get_weather", "send_email"]),
    ("Is it going to rain in Portland this week? I think in fahrenheit.", ["get_weather", "create_event"]),
    ("Book a table for four at Trattoria Lucia on 2027-03-14 at 19:30.", ["book_table", "send_email"]),
    ("Reserve a table at The Copper Kettle for two people, 2027-05-02, 12:15.", ["book_table", "get_weather"]),
    ("Email maria.keller@example.com that the quarterly report is ready for review.", ["send_email", "create_event"]),
    ("Send a short thank-you note to the team at team@example.org for finishing the migration.", ["send_email", "book_table"]),
    ("Find me a kitchen scale under 40 dollars.", ["search_products", "convert_currency"]),
    ("I need a children's book about dinosaurs, nothing over 15.", ["search_products", "send_email"]),
    ("Schedule a 45-minute design review on 2027-02-09T10:00 with Ana and Tomas.", ["create_event", "send_email"]),
    ("Put a one-hour dentist appointment in my calendar for 2027-06-21T08:30.", ["create_event", "get_weather"]),
    ("How much is 250 euros in US dollars?", ["convert_currency", "search_products"]),
    ("Convert 12000 yen to pounds, please.", ["convert_currency", "get_weather"]),
    ("Look for a garden hose reel, budget 60.", ["search_products", "book_table"]),
    ("What's the forecast for Nairobi over the next 7 days in celsius?", ["get_weather", "convert_currency"]),
    ("Invite Priya, Jonas and Mei to a 30 minute sync on 2027-01-18T15:00 called Roadmap check-in.", ["create_event", "send_email"]),
    ("Tell hr@example.com that I will be on leave from 2027-04-01 to 2027-04-05.", ["send_email", "create_event"]),
]

EXTRACTIONS = [
    ("contact", obj({"name": s(40), "company": s(40), "email": s(60), "phone": s(24)}),
     "Hi, this is Daniel Okafor from Brightline Logistics. You can reach me at d.okafor@brightline.example "
     "or on +44 20 7946 0018 any weekday."),
    ("contact", obj({"name": s(40), "company": s(40), "email": s(60), "phone": s(24)}),
     "Please forward the contract to Sofia Marquez (Marquez & Hall Architects), sofia@mh-arch.example, "
     "tel. 555-0142."),
    ("invoice", obj({"invoice_number": s(20), "total": {"type": "number", "minimum": 0, "maximum": 1e7},
                     "currency": {"enum": ["EUR", "USD", "GBP"]}, "due_date": s(20), "paid": {"type": "boolean"}}),
     "Invoice INV-20931 from Northwind Parts: total amount 1,284.50 EUR, payable by 15 March 2027. "
     "Status: outstanding."),
    ("invoice", obj({"invoice_number": s(20), "total": {"type": "number", "minimum": 0, "maximum": 1e7},
                     "currency": {"enum": ["EUR", "USD", "GBP"]}, "due_date": s(20), "paid": {"type": "boolean"}}),
     "Receipt for order 7781-B: we received your payment of $310.00 on January 4, 2027. Thank you!"),
    ("review", obj({"product": s(40), "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                    "sentiment": {"enum": ["positive", "neutral", "negative"]}, "pros": {"type": "array", "items": s(40), "maxItems": 3},
                    "cons": {"type": "array", "items": s(40), "maxItems": 3}}),
     "I bought the Aurora desk lamp last month. The light is warm and the dimmer is smooth, but the base "
     "wobbles and the cable is too short. Three stars from me."),
    ("review", obj({"product": s(40), "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                    "sentiment": {"enum": ["positive", "neutral", "negative"]}, "pros": {"type": "array", "items": s(40), "maxItems": 3},
                    "cons": {"type": "array", "items": s(40), "maxItems": 3}}),
     "The TrailMate 2 backpack is fantastic: light, lots of pockets, and it survived a week of rain. "
     "Easily five stars."),
    ("event", obj({"title": s(60), "date": s(20), "location": s(60), "speakers": {"type": "array", "items": s(40), "maxItems": 4}}),
     "Join us for 'Soil and Cities', a talk by Dr. Lena Fischer and Omar Haddad, on 22 April 2027 at the "
     "Riverside Community Hall."),
    ("event", obj({"title": s(60), "date": s(20), "location": s(60), "speakers": {"type": "array", "items": s(40), "maxItems": 4}}),
     "The annual chess open takes place on 9 September 2027 in the old library on Market Street; "
     "grandmaster Irina Volkova gives the opening simul."),
    ("ticket", obj({"category": {"enum": ["billing", "bug", "feature_request", "account", "other"]},
                    "priority": {"enum": ["low", "medium", "high", "urgent"]}, "summary": s(80),
                    "customer_id": s(16)}),
     "Customer C-44817 writes: I was charged twice for my March subscription and need a refund before my "
     "rent is due on Friday."),
    ("ticket", obj({"category": {"enum": ["billing", "bug", "feature_request", "account", "other"]},
                    "priority": {"enum": ["low", "medium", "high", "urgent"]}, "summary": s(80),
                    "customer_id": s(16)}),
     "From user U-1029: the export button does nothing in Firefox since yesterday's update. Not urgent, "
     "we can use Chrome meanwhile."),
    ("recipe", obj({"dish": s(40), "servings": {"type": "integer", "minimum": 1, "maximum": 20},
                    "ingredients": {"type": "array", "items": s(40), "maxItems": 8},
                    "minutes": {"type": "integer", "minimum": 1, "maximum": 600}}),
     "Lemon pasta for 2: 200 g spaghetti, one lemon, 40 g butter, parmesan, black pepper. Ready in 20 minutes."),
    ("recipe", obj({"dish": s(40), "servings": {"type": "integer", "minimum": 1, "maximum": 20},
                    "ingredients": {"type": "array", "items": s(40), "maxItems": 8},
                    "minutes": {"type": "integer", "minimum": 1, "maximum": 600}}),
     "Grandma's lentil soup feeds six: red lentils, carrots, onion, cumin, vegetable stock and a bay leaf; "
     "simmer for about 45 minutes."),
    ("flight", obj({"airline": s(30), "flight_number": s(10), "from": s(3), "to": s(3), "departure": s(20),
                    "seat": s(5)}),
     "Your booking is confirmed: Skyway Air SW 482 from LIS to AMS, departing 2027-07-03 06:55, seat 14C."),
    ("flight", obj({"airline": s(30), "flight_number": s(10), "from": s(3), "to": s(3), "departure": s(20),
                    "seat": s(5)}),
     "Boarding pass: Northern Star Airlines flight NS 19, Oslo (OSL) to Reykjavik (KEF), 2027-11-20 13:40, seat 2A."),
    ("job", obj({"title": s(50), "company": s(40), "remote": {"type": "boolean"},
                 "salary_min": {"type": "integer", "minimum": 0, "maximum": 1000000},
                 "skills": {"type": "array", "items": s(30), "maxItems": 5}}),
     "Tidewater Labs is hiring a Senior Data Engineer (fully remote). Salary from 95,000. You should know "
     "Python, SQL and Spark."),
    ("job", obj({"title": s(50), "company": s(40), "remote": {"type": "boolean"},
                 "salary_min": {"type": "integer", "minimum": 0, "maximum": 1000000},
                 "skills": {"type": "array", "items": s(30), "maxItems": 5}}),
     "On-site barista wanted at Café Meridian in Ghent, starting at 2,100 per month; latte art and a "
     "friendly attitude required."),
]


def main():
    lines = []
    for i, (text, names) in enumerate(TOOL_REQUESTS):
        tools = ", ".join(names)
        prompt = (f"You can call these tools: {tools}. Answer with one tool call as JSON with the fields "
                  f"\"name\" and \"arguments\".\nRequest: {text}")
        schema = {"anyOf": [TOOLS[n] for n in names]}
        lines.append({"id": f"tool-{i:02d}", "category": "tool_call", "prompt": prompt,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "tool_call", "schema": schema, "strict": True}}})
    for i, (kind, schema, text) in enumerate(EXTRACTIONS):
        fields = ", ".join(schema["properties"])
        prompt = f"Extract the {kind} details ({fields}) from the text below as JSON.\nText: {text}"
        lines.append({"id": f"extract-{i:02d}", "category": "extraction", "prompt": prompt,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": kind, "schema": schema, "strict": True}}})
    out = Path(__file__).resolve().parent.parent / "specserve/data/bench/structured.jsonl"
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(f"{len(lines)} requests -> {out}")


if __name__ == "__main__":
    main()
